//! The protobuf well-known types the admin APIs answer with: `google.protobuf.Timestamp` from
//! and to microseconds since the epoch, and `google.protobuf.Any` of a message.

use prost::Message;
use prost_types::{Any, Timestamp};

/// A timestamp of `micros` since the epoch (negative ones too: the nanos stay in 0..1e9).
pub(crate) fn timestamp(micros: i64) -> Timestamp {
    Timestamp {
        seconds: micros.div_euclid(1_000_000),
        nanos: (micros.rem_euclid(1_000_000) * 1000) as i32,
    }
}

/// Now, as a timestamp.
pub(crate) fn now_timestamp() -> Timestamp {
    timestamp(basalt_model::hlc::now_micros())
}

/// A timestamp in microseconds since the epoch (saturating; finer than microseconds is cut).
pub(crate) fn micros_of(t: &Timestamp) -> i64 {
    t.seconds
        .saturating_mul(1_000_000)
        .saturating_add(i64::from(t.nanos) / 1000)
}

/// `micros` since the epoch as RFC 3339 (UTC), for messages.
pub(crate) fn rfc3339(micros: i64) -> String {
    timestamp(micros).to_string()
}

/// `m` packed in an `Any` of the full type name `type_name`
/// (e.g. `google.bigtable.admin.v2.Backup`).
pub(crate) fn any<M: Message>(type_name: &str, m: &M) -> Any {
    Any {
        type_url: format!("type.googleapis.com/{type_name}"),
        value: m.encode_to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_round_trip_through_micros() {
        for micros in [
            0,
            1,
            999_999,
            1_000_000,
            1_700_000_000_123_456,
            -1,
            -1_000_001,
        ] {
            let t = timestamp(micros);
            assert!((0..1_000_000_000).contains(&t.nanos), "{t:?}");
            assert_eq!(micros_of(&t), micros);
        }
        assert_eq!(
            timestamp(-1),
            Timestamp {
                seconds: -1,
                nanos: 999_999_000
            }
        );
    }

    #[test]
    fn any_names_the_full_type() {
        let a = any("google.protobuf.Timestamp", &timestamp(5));
        assert_eq!(a.type_url, "type.googleapis.com/google.protobuf.Timestamp");
        assert_eq!(Timestamp::decode(a.value.as_slice()).unwrap(), timestamp(5));
    }
}
