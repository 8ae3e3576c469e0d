//! The gRPC codec of the services Basalt serves: prost's, except for one kind of bad input.
//!
//! Protobuf decoders stop at 100 nested messages (prost's and the C++ library's recursion
//! limit), and tonic reports any decode failure as INTERNAL. A RowFilter nests two messages
//! per level (`RowFilter` → `Chain` → `RowFilter`), so a well-formed filter nested ~50 deep
//! never reaches the filter validation that rejects anything deeper than
//! [`crate::filter::MAX_FILTER_DEPTH`] with INVALID_ARGUMENT. Such a request is the client's
//! bad input, not a server fault: this codec answers it with INVALID_ARGUMENT and a message
//! about the nesting, like depths 21–49 get. Every other decode failure keeps tonic's
//! INTERNAL (gRPC's status-code guide maps parse errors there).

use std::marker::PhantomData;

use prost::Message;
use tonic::Status;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic_prost::ProstCodec;

/// `tonic_prost::ProstCodec` with recursion-limit failures mapped to INVALID_ARGUMENT.
#[derive(Debug, Clone, Default)]
pub struct BasaltCodec<T, U> {
    _pd: PhantomData<(T, U)>,
}

impl<T, U> Codec for BasaltCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = <ProstCodec<T, U> as Codec>::Encoder;
    type Decoder = BasaltDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::raw_encoder(BufferSettings::default())
    }

    fn decoder(&mut self) -> Self::Decoder {
        BasaltDecoder { _pd: PhantomData }
    }
}

/// Decodes `U` with prost; see the module docs for the error mapping.
#[derive(Debug)]
pub struct BasaltDecoder<U> {
    _pd: PhantomData<U>,
}

impl<U: Message + Default> Decoder for BasaltDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        U::decode(buf).map(Some).map_err(decode_status)
    }
}

/// The status for a request that does not decode.
fn decode_status(error: prost::DecodeError) -> Status {
    let text = error.to_string();
    // prost exposes the kind of a DecodeError only through its text; a unit test below pins
    // the wording this depends on.
    if text.contains("recursion limit reached") {
        Status::invalid_argument(format!(
            "the request nests messages deeper than protobuf's limit of 100 (a RowFilter may \
             nest chains, interleaves and conditions at most {} deep): {text}",
            crate::filter::MAX_FILTER_DEPTH
        ))
    } else {
        Status::internal(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use googleapis_tonic_google_bigtable_v2::google::bigtable::v2 as pb;
    use pb::row_filter::{Chain, Filter};

    fn nested_filter(depth: usize) -> pb::RowFilter {
        let pass_all = pb::RowFilter {
            filter: Some(Filter::PassAllFilter(true)),
        };
        let mut f = pass_all.clone();
        for _ in 0..depth {
            f = pb::RowFilter {
                filter: Some(Filter::Chain(Chain {
                    filters: vec![f, pass_all.clone()],
                })),
            };
        }
        f
    }

    fn decode(req: &pb::ReadRowsRequest) -> Result<pb::ReadRowsRequest, Status> {
        pb::ReadRowsRequest::decode(&req.encode_to_vec()[..]).map_err(decode_status)
    }

    #[test]
    fn too_deep_a_request_is_invalid_argument() {
        let req = |depth| pb::ReadRowsRequest {
            table_name: "projects/p/instances/i/tables/t".into(),
            filter: Some(nested_filter(depth)),
            ..Default::default()
        };
        // Depth 30 decodes (the filter validation rejects it later).
        assert!(decode(&req(30)).is_ok());
        let status = decode(&req(60)).expect_err("60 levels exceed the recursion limit");
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(
            status.message().contains("at most 20 deep"),
            "{}",
            status.message()
        );
    }

    #[test]
    fn garbage_is_internal() {
        let status = pb::ReadRowsRequest::decode(&[0xff, 0xff, 0xff][..])
            .map_err(decode_status)
            .expect_err("not a message");
        assert_eq!(status.code(), tonic::Code::Internal);
    }
}
