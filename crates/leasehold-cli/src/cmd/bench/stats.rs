//! The measured server's CPU time and memory, from `/proc`.

/// CPU seconds (user + system) of a process and every process below it, so
/// that a server made of several processes (PostgreSQL's backends) counts
/// whole. Children that already exited count through the parent's
/// cutime/cstime.
pub(super) fn cpu_seconds(pid: u32) -> Option<f64> {
    // (pid, parent pid, own ticks, waited-for children's ticks) of every process.
    let mut table = Vec::new();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(p) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
            continue;
        };
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let f: Vec<u64> = rest
            .split_whitespace()
            .skip(1)
            .map(|v| v.parse().unwrap_or(0))
            .collect();
        // After the state: ppid is field 0; utime, stime, cutime, cstime are 10..=13.
        if f.len() > 13 {
            table.push((p, f[0] as u32, f[10] + f[11], f[12] + f[13]));
        }
    }
    let mut ticks = 0;
    let mut found = false;
    let mut frontier = vec![pid];
    while let Some(p) = frontier.pop() {
        for &(child, parent, own, reaped) in &table {
            if child == p {
                found = true;
                ticks += own + reaped;
            }
            if parent == p {
                frontier.push(child);
            }
        }
    }
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    found.then(|| ticks as f64 / hz)
}

/// Resident memory of a process, in bytes.
pub(super) fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: u64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kb * 1024)
}
