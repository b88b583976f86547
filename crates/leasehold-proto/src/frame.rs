//! The framed protocol: the unary calls of `leasehold.v1`, multiplexed over
//! one TCP connection without HTTP.
//!
//! A connection starts with the 8-byte [`PREAMBLE`] from the client (its first
//! byte, 0, is never the first byte of an HTTP request, so the server tells
//! the protocols apart on one port). Then both sides send frames:
//!
//! ```text
//! length: u32 BE (of what follows) | id: u64 BE | tag: u8 | body: protobuf
//! ```
//!
//! A request's tag is its [`Op`] and its body the method's request message;
//! the reply carries the same id, [`REPLY_OK`] and the response message, or
//! [`REPLY_ERROR`] and an [`ErrorReply`](crate::v1::ErrorReply). Replies come
//! in the order their calls finish, not the order they were sent; the id
//! pairs them up. Acquires that wait are not taken here: a caller that gives
//! up on a wait needs its own stream to withdraw it, which gRPC has.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio_util::codec::{Decoder, Encoder};

/// What a client sends first: protocol name and version.
pub const PREAMBLE: &[u8; 8] = b"\0LHFRM1\n";

/// The largest request frame: room for the largest call, a 64 KiB checkpoint
/// with a 512-byte key, and small enough that a connection's calls in flight
/// stay bounded in memory.
pub const MAX_REQUEST: usize = 128 << 10;

/// The largest reply frame (a revoke lists every key it released).
pub const MAX_REPLY: usize = 64 << 20;

/// A reply's tag when the call succeeded.
pub const REPLY_OK: u8 = 0;
/// A reply's tag when the call failed.
pub const REPLY_ERROR: u8 = 1;

/// The calls the framed protocol carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Op {
    /// `Grant`.
    Grant = 1,
    /// `KeepAlive`.
    KeepAlive = 2,
    /// `Revoke`.
    Revoke = 3,
    /// `Acquire` with `wait_ms` = 0.
    Acquire = 4,
    /// `Release`.
    Release = 5,
    /// `SaveCheckpoint`.
    SaveCheckpoint = 6,
    /// Sets the token that the connection's later calls act for
    /// ([`AuthenticateRequest`](crate::v1::AuthenticateRequest)). Applied in
    /// order: a call sent after it acts for the token, one sent before it
    /// does not. A bad token is refused (`unauthenticated`) and leaves the
    /// connection as it was.
    Authenticate = 7,
    /// `KeepAliveMany`. A server from before it answers `invalid_argument`
    /// (unknown operation 8): renew one lease per call there.
    KeepAliveMany = 8,
}

impl TryFrom<u8> for Op {
    type Error = u8;

    fn try_from(tag: u8) -> Result<Op, u8> {
        Ok(match tag {
            1 => Op::Grant,
            2 => Op::KeepAlive,
            3 => Op::Revoke,
            4 => Op::Acquire,
            5 => Op::Release,
            6 => Op::SaveCheckpoint,
            7 => Op::Authenticate,
            8 => Op::KeepAliveMany,
            other => return Err(other),
        })
    }
}

/// One frame, either way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// Pairs a reply with its request; chosen by the client.
    pub id: u64,
    /// An [`Op`] on a request; [`REPLY_OK`] or [`REPLY_ERROR`] on a reply.
    pub tag: u8,
    /// The protobuf message.
    pub body: Bytes,
}

impl Frame {
    /// A frame carrying `message`.
    pub fn new(id: u64, tag: u8, message: &impl prost::Message) -> Frame {
        Frame {
            id,
            tag,
            body: message.encode_to_vec().into(),
        }
    }
}

/// Why a stream of frames cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// A frame larger than the codec's limit, or too short to hold an id and
    /// a tag.
    #[error("frame of {len} bytes (must be 9 ..= {max})")]
    Size {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The socket failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// Length-prefixed frames, for `tokio_util::codec::Framed{Read,Write}`, up to
/// a limit: [`FrameCodec::requests`] or [`FrameCodec::replies`].
#[derive(Debug, Clone, Copy)]
pub struct FrameCodec {
    max: usize,
}

impl FrameCodec {
    /// For requests: at most [`MAX_REQUEST`] bytes.
    pub const fn requests() -> FrameCodec {
        FrameCodec { max: MAX_REQUEST }
    }

    /// For replies: at most [`MAX_REPLY`] bytes.
    pub const fn replies() -> FrameCodec {
        FrameCodec { max: MAX_REPLY }
    }
}

const HEADER: usize = 4;
const ID_AND_TAG: usize = 9;

impl Decoder for FrameCodec {
    type Item = Frame;
    type Error = FrameError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
        let Some(prefix) = src.get(..HEADER) else {
            return Ok(None);
        };
        let len = u32::from_be_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]) as usize;
        if !(ID_AND_TAG..=self.max).contains(&len) {
            return Err(FrameError::Size { len, max: self.max });
        }
        if src.len() < HEADER + len {
            src.reserve(HEADER + len - src.len());
            return Ok(None);
        }
        src.advance(HEADER);
        let mut frame = src.split_to(len);
        let id = frame.get_u64();
        let tag = frame.get_u8();
        Ok(Some(Frame {
            id,
            tag,
            body: frame.freeze(),
        }))
    }
}

impl Encoder<Frame> for FrameCodec {
    type Error = FrameError;

    fn encode(&mut self, frame: Frame, dst: &mut BytesMut) -> Result<(), FrameError> {
        let len = ID_AND_TAG + frame.body.len();
        if len > self.max {
            return Err(FrameError::Size { len, max: self.max });
        }
        dst.reserve(HEADER + len);
        dst.put_u32(len as u32);
        dst.put_u64(frame.id);
        dst.put_u8(frame.tag);
        dst.put_slice(&frame.body);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_split_anywhere() {
        let frames = vec![
            Frame {
                id: 7,
                tag: Op::Acquire as u8,
                body: Bytes::from_static(b"abc"),
            },
            Frame {
                id: u64::MAX,
                tag: REPLY_ERROR,
                body: Bytes::new(),
            },
        ];
        let mut wire = BytesMut::new();
        for f in &frames {
            FrameCodec::requests().encode(f.clone(), &mut wire).unwrap();
        }
        // Fed one byte at a time, the decoder yields the same frames.
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        for b in wire.iter() {
            buf.put_u8(*b);
            while let Some(f) = FrameCodec::requests().decode(&mut buf).unwrap() {
                out.push(f);
            }
        }
        assert_eq!(out, frames);
        assert!(buf.is_empty());
    }

    #[test]
    fn oversized_and_undersized_lengths_are_refused() {
        for len in [0u32, 8, (MAX_REQUEST + 1) as u32, u32::MAX] {
            let mut buf = BytesMut::from(&len.to_be_bytes()[..]);
            assert!(matches!(
                FrameCodec::requests().decode(&mut buf),
                Err(FrameError::Size { .. })
            ));
        }
        // A reply may be larger than any request.
        let mut buf = BytesMut::from(&((MAX_REQUEST + 1) as u32).to_be_bytes()[..]);
        assert!(matches!(FrameCodec::replies().decode(&mut buf), Ok(None)));
        let big = Frame {
            id: 1,
            tag: Op::Grant as u8,
            body: vec![0; MAX_REQUEST].into(),
        };
        assert!(FrameCodec::requests()
            .encode(big, &mut BytesMut::new())
            .is_err());
    }

    #[test]
    fn unknown_ops_are_refused() {
        assert_eq!(Op::try_from(0), Err(0));
        assert_eq!(Op::try_from(9), Err(9));
        assert_eq!(Op::try_from(4), Ok(Op::Acquire));
        assert_eq!(Op::try_from(7), Ok(Op::Authenticate));
        assert_eq!(Op::try_from(8), Ok(Op::KeepAliveMany));
    }

    proptest::proptest! {
        /// Whatever bytes arrive, in whatever pieces, the decoder yields
        /// frames or a size error and never panics; well-formed frames come
        /// back as they were sent.
        #[test]
        fn any_bytes_decode_without_panicking(
            frames in proptest::collection::vec(
                (proptest::prelude::any::<u64>(), proptest::prelude::any::<u8>(),
                 proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64)),
                0..8,
            ),
            noise in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
            cut in 1usize..16,
        ) {
            let sent: Vec<Frame> = frames
                .into_iter()
                .map(|(id, tag, body)| Frame { id, tag, body: body.into() })
                .collect();
            let mut wire = BytesMut::new();
            for f in &sent {
                FrameCodec::requests().encode(f.clone(), &mut wire).unwrap();
            }
            wire.extend_from_slice(&noise);
            let mut codec = FrameCodec::requests();
            let mut buf = BytesMut::new();
            let mut got = Vec::new();
            'feed: for piece in wire.chunks(cut) {
                buf.extend_from_slice(piece);
                loop {
                    match codec.decode(&mut buf) {
                        Ok(Some(f)) => got.push(f),
                        Ok(None) => break,
                        Err(FrameError::Size { .. }) => break 'feed,
                        Err(e) => panic!("{e}"),
                    }
                }
            }
            proptest::prop_assert!(got.len() >= sent.len());
            proptest::prop_assert_eq!(&got[..sent.len()], &sent[..]);
        }
    }
}
