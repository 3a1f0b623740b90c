//! Wall-clock time as the log and the wire carry it: Unix milliseconds, shown as RFC 3339 UTC.
//!
//! Invariants: [`rfc3339`] always gives `YYYY-MM-DDTHH:MM:SS.mmmZ` (UTC, exactly three decimal
//! digits; `schema/` and the tests expect that shape), and [`parse_rfc3339_ms`] reads back every
//! time [`rfc3339`] writes to the same millisecond. Nothing here reads anything but the clock.

use std::num::NonZeroU8;
use std::time::{SystemTime, UNIX_EPOCH};
use time::format_description::well_known::{Iso8601, Rfc3339, iso8601};
use time::{OffsetDateTime, PrimitiveDateTime};

/// Now, in milliseconds since the Unix epoch (0 if the clock is before it).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX))
}

/// `2026-11-22T21:56:39.123Z`: four-digit year, milliseconds, UTC written `Z`.
const WIRE_FORMAT: iso8601::EncodedConfig = iso8601::Config::DEFAULT
    .set_time_precision(iso8601::TimePrecision::Second { decimal_digits: NonZeroU8::new(3) })
    .encode();

/// Unix milliseconds as RFC 3339 UTC (`2026-11-22T21:56:39.123Z`). Times past the year 9999
/// (which a four-digit year cannot show) are shown as its last millisecond.
pub fn rfc3339(time_ms: u64) -> String {
    let nanos = i128::from(time_ms) * 1_000_000;
    let time = OffsetDateTime::from_unix_timestamp_nanos(nanos)
        .ok()
        .filter(|time| time.year() <= 9999)
        .unwrap_or_else(last_showable);
    time.format(&Iso8601::<WIRE_FORMAT>).unwrap_or_else(|_| "9999-12-31T23:59:59.999Z".to_string())
}

fn last_showable() -> OffsetDateTime {
    PrimitiveDateTime::new(
        time::Date::from_calendar_date(9999, time::Month::December, 31).unwrap_or(time::Date::MAX),
        time::Time::from_hms_milli(23, 59, 59, 999).unwrap_or(time::Time::MIDNIGHT),
    )
    .assume_utc()
}

/// An RFC 3339 time (`2026-11-22T21:56:39.123Z`, `...+01:00`, a space instead of `T`) as Unix
/// milliseconds (digits past the millisecond are dropped). None when it is not such a time or
/// is before 1970.
pub fn parse_rfc3339_ms(text: &str) -> Option<u64> {
    let text = text.trim();
    // RFC 3339 allows a space between date and time "for readability"; the parser wants a `T`.
    let normalized;
    let text = if text.as_bytes().get(10) == Some(&b' ') {
        normalized = format!("{}T{}", &text[..10], &text[11..]);
        normalized.as_str()
    } else {
        text
    };
    let time = OffsetDateTime::parse(text, &Rfc3339).ok()?;
    u64::try_from(time.unix_timestamp_nanos().div_euclid(1_000_000)).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_formats_known_instants() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(rfc3339(1_795_384_599_123), "2026-11-22T21:56:39.123Z");
        assert_eq!(rfc3339(u64::MAX), "9999-12-31T23:59:59.999Z");
    }

    #[test]
    fn rfc3339_times_parse_back_to_the_milliseconds_the_wire_shows() {
        for millis in [0, 951_782_400_000, 1_795_384_599_123, 1_767_225_600_000] {
            assert_eq!(parse_rfc3339_ms(&rfc3339(millis)), Some(millis));
        }
        assert_eq!(parse_rfc3339_ms("2026-11-22T22:56:39+01:00"), Some(1_795_384_599_000));
        assert_eq!(parse_rfc3339_ms("2026-11-22T21:56:39.5Z"), Some(1_795_384_599_500));
        assert_eq!(parse_rfc3339_ms("2026-11-22 21:56:39.5z"), Some(1_795_384_599_500));
        assert_eq!(parse_rfc3339_ms("2026-11-22T21:56:39.123456Z"), Some(1_795_384_599_123));
        assert_eq!(parse_rfc3339_ms("yesterday"), None);
        assert_eq!(parse_rfc3339_ms("2026-13-01T00:00:00Z"), None);
        assert_eq!(parse_rfc3339_ms("1969-12-31T23:59:59Z"), None);
    }
}
