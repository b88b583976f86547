//! The process's own metrics, under the names every Prometheus client
//! library gives them (`process_*`), so dashboards and alerts written for
//! any service work here too, and the build that runs.
//!
//! | metric | type | what |
//! |---|---|---|
//! | `process_cpu_seconds_total` | counter | user and system CPU time |
//! | `process_resident_memory_bytes` | gauge | resident memory |
//! | `process_virtual_memory_bytes` | gauge | virtual memory |
//! | `process_open_fds` | gauge | open file descriptors |
//! | `process_max_fds` | gauge | the open-file limit |
//! | `process_threads` | gauge | threads |
//! | `process_start_time_seconds` | gauge | start, in Unix seconds |
//! | `leasehold_build_info{version}` | gauge | 1, labelled with the build's version |
//!
//! Read from `/proc/self` when `/metrics` is scraped; on a system without
//! it they stay 0.

use std::sync::atomic::AtomicU64;

use parking_lot::Mutex;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabel {
    version: &'static str,
}

/// The process metrics, registered.
pub(super) struct Process {
    cpu: Counter<f64, AtomicU64>,
    /// CPU seconds counted so far: the counter only goes up by differences.
    cpu_counted: Mutex<f64>,
    resident: Gauge,
    virtual_memory: Gauge,
    open_fds: Gauge,
    max_fds: Gauge,
    threads: Gauge,
    start: Gauge<f64, AtomicU64>,
}

/// What `/proc/self/stat` says of this process.
#[derive(Debug, Default, PartialEq)]
struct Stat {
    cpu_ticks: u64,
    threads: u64,
    start_ticks: u64,
    virtual_bytes: u64,
    resident_pages: u64,
}

/// Reads `/proc/self/stat`'s fields after the command name (which may hold
/// spaces and parentheses, so it is skipped up to the last `)`).
fn parse_stat(text: &str) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let n = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
    // Field 3 (state) is fields[0]: utime is field 14, stime 15, threads
    // 20, starttime 22, vsize 23, rss 24.
    Some(Stat {
        cpu_ticks: n(11)? + n(12)?,
        threads: n(17)?,
        start_ticks: n(19)?,
        virtual_bytes: n(20)?,
        resident_pages: n(21)?,
    })
}

fn to_gauge(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl Process {
    pub(super) fn register(r: &mut Registry) -> Process {
        let p = Process {
            cpu: Counter::default(),
            cpu_counted: Mutex::new(0.0),
            resident: Gauge::default(),
            virtual_memory: Gauge::default(),
            open_fds: Gauge::default(),
            max_fds: Gauge::default(),
            threads: Gauge::default(),
            start: Gauge::default(),
        };
        r.register(
            "process_cpu_seconds",
            "User and system CPU time spent, in seconds",
            p.cpu.clone(),
        );
        r.register(
            "process_resident_memory_bytes",
            "Resident memory size in bytes",
            p.resident.clone(),
        );
        r.register(
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes",
            p.virtual_memory.clone(),
        );
        r.register(
            "process_open_fds",
            "Open file descriptors",
            p.open_fds.clone(),
        );
        r.register(
            "process_max_fds",
            "The limit of open file descriptors",
            p.max_fds.clone(),
        );
        r.register(
            "process_threads",
            "Threads of the process",
            p.threads.clone(),
        );
        r.register(
            "process_start_time_seconds",
            "When the process started, in Unix seconds",
            p.start.clone(),
        );
        let build: Family<BuildLabel, Gauge> = Family::default();
        build
            .get_or_create(&BuildLabel {
                version: env!("CARGO_PKG_VERSION"),
            })
            .set(1);
        r.register(
            "leasehold_build_info",
            "1, labelled with the version of the build that runs",
            build,
        );
        p
    }

    /// Reads the process's state now.
    pub(super) fn sample(&self) {
        // SAFETY: sysconf reads a configuration value; no memory is touched.
        let (ticks, page) = unsafe {
            (
                libc::sysconf(libc::_SC_CLK_TCK),
                libc::sysconf(libc::_SC_PAGESIZE),
            )
        };
        let (ticks, page) = (ticks.max(1) as f64, page.max(1) as u64);
        if let Some(stat) = std::fs::read_to_string("/proc/self/stat")
            .ok()
            .as_deref()
            .and_then(parse_stat)
        {
            let cpu = stat.cpu_ticks as f64 / ticks;
            let mut counted = self.cpu_counted.lock();
            if cpu > *counted {
                self.cpu.inc_by(cpu - *counted);
                *counted = cpu;
            }
            self.threads.set(to_gauge(stat.threads));
            self.virtual_memory.set(to_gauge(stat.virtual_bytes));
            self.resident
                .set(to_gauge(stat.resident_pages.saturating_mul(page)));
            let boot = std::fs::read_to_string("/proc/stat").ok().and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("btime "))
                    .and_then(|v| v.trim().parse::<u64>().ok())
            });
            if let Some(boot) = boot {
                self.start
                    .set(boot as f64 + stat.start_ticks as f64 / ticks);
            }
        }
        if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
            self.open_fds.set(to_gauge(fds.count() as u64));
        }
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes into the struct we own.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0 {
            self.max_fds.set(to_gauge(limit.rlim_cur));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_is_read_past_a_name_with_spaces_and_parentheses() {
        let line = "4242 (lease (holdd) x) S 1 4242 4242 0 -1 4194560 1200 0 0 0 150 50 0 0 20 0 3 0 987654 123456789 2048 18446744073709551615";
        assert_eq!(
            parse_stat(line),
            Some(Stat {
                cpu_ticks: 200,
                threads: 3,
                start_ticks: 987654,
                virtual_bytes: 123456789,
                resident_pages: 2048,
            })
        );
        assert_eq!(parse_stat("no parenthesis"), None);
        assert_eq!(parse_stat("1 (x) S 1"), None);
    }

    #[test]
    fn this_process_is_measured() {
        let mut r = Registry::default();
        let p = Process::register(&mut r);
        p.sample();
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &r).expect("encode");
        for name in [
            "process_cpu_seconds_total",
            "process_resident_memory_bytes",
            "process_open_fds",
            "process_max_fds",
            "process_start_time_seconds",
        ] {
            assert!(text.contains(&format!("\n{name} ")), "{name} in {text}");
        }
        assert!(text.contains("leasehold_build_info{version=\""), "{text}");
        let resident: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("process_resident_memory_bytes "))
            .and_then(|v| v.parse().ok())
            .expect("a value");
        assert!(resident > 0.0);
    }
}
