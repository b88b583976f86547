//! The gRPC codec of the generated service: tonic's prost codec, except that
//! a message that cannot be decoded is the sender's fault and says so.
//!
//! tonic answers an undecodable request with `INTERNAL`, which tells a client
//! that the server failed and invites a retry of the same bytes. It is
//! `INVALID_ARGUMENT`, with the `leasehold-code` entry every other refusal
//! carries.

use prost::Message;
use tonic::codec::{Codec, DecodeBuf, Decoder, ProstCodec as Inner};
use tonic::metadata::MetadataValue;
use tonic::Status;

/// [`tonic::codec::ProstCodec`] with decode errors as `INVALID_ARGUMENT`.
#[derive(Debug, Clone)]
pub struct ProstCodec<T, U> {
    inner: Inner<T, U>,
}

impl<T, U> Default for ProstCodec<T, U> {
    fn default() -> Self {
        ProstCodec {
            inner: Inner::default(),
        }
    }
}

impl<T, U> Codec for ProstCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = <Inner<T, U> as Codec>::Encoder;
    type Decoder = InvalidOnError<<Inner<T, U> as Codec>::Decoder>;

    fn encoder(&mut self) -> Self::Encoder {
        self.inner.encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        InvalidOnError(self.inner.decoder())
    }
}

/// A decoder whose failures are `INVALID_ARGUMENT`.
#[derive(Debug)]
pub struct InvalidOnError<D>(D);

impl<D: Decoder<Error = Status>> Decoder for InvalidOnError<D> {
    type Item = D::Item;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Self::Item>, Status> {
        self.0.decode(src).map_err(|e| {
            let mut status = Status::invalid_argument(format!(
                "invalid body: the message cannot be decoded: {}",
                e.message()
            ));
            status.metadata_mut().insert(
                "leasehold-code",
                MetadataValue::from_static("invalid_argument"),
            );
            status
        })
    }

    fn buffer_settings(&self) -> tonic::codec::BufferSettings {
        self.0.buffer_settings()
    }
}
