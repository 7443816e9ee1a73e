//! Durations as people write them in a config file: `500ms`, `5s`, `2m`, `24h`, `7d`.
//!
//! Why a format of our own and not seconds as numbers: leases, timeouts and retentions
//! span milliseconds to days, and a reader must not count zeros. Why it writes back the
//! same form it reads: a typed [`Config`](super::Config) is written to a file that a
//! spawned process loads, so the writer must produce what the parser accepts — in the
//! largest unit that is exact (`120s` is written `2m`).

use std::time::Duration;

const UNITS: [(&str, u64); 4] = [("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1)];

/// Parse `500ms`, `5s`, `2m`, `24h`, `7d` (an integer and a unit).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().map_err(|_| {
        format!("{s:?} is not a duration like \"500ms\", \"5s\", \"2m\", \"24h\", \"7d\"")
    })?;
    let unit = unit.trim();
    if unit == "ms" {
        return Ok(Duration::from_millis(n));
    }
    let Some((_, secs)) = UNITS.iter().find(|(name, _)| *name == unit) else {
        return Err(format!("{s:?} has no unit: use ms, s, m, h or d"));
    };
    n.checked_mul(*secs)
        .map(Duration::from_secs)
        .ok_or_else(|| format!("{s:?} is too long"))
}

/// The inverse of [`parse_duration`], in the largest exact unit (`2m`, `200ms`, `0s`).
/// A duration with a part finer than a millisecond has no such form: an error.
pub fn format_duration(d: Duration) -> Result<String, String> {
    if !d.subsec_nanos().is_multiple_of(1_000_000) {
        return Err(format!(
            "{d:?} is not a whole number of milliseconds (the finest unit a config reads)"
        ));
    }
    if d.subsec_millis() != 0 {
        return Ok(format!("{}ms", d.as_millis()));
    }
    let secs = d.as_secs();
    if secs == 0 {
        return Ok("0s".into());
    }
    let (unit, size) = UNITS
        .iter()
        .find(|(_, size)| secs.is_multiple_of(*size))
        .copied()
        .unwrap_or(("s", 1));
    Ok(format!("{}{unit}", secs / size))
}

/// `#[serde(with = "human")]`: a [`Duration`] as a human string.
pub(crate) mod human {
    use serde::{Deserialize as _, Deserializer, Serializer};
    use std::time::Duration;

    pub(crate) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        let text = super::format_duration(*d).map_err(serde::ser::Error::custom)?;
        s.serialize_str(&text)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = String::deserialize(d)?;
        super::parse_duration(&s).map_err(serde::de::Error::custom)
    }
}

/// `#[serde(with = "human_opt")]`: an optional [`Duration`] as a human string (absent
/// when `None`; pair it with `skip_serializing_if = "Option::is_none"`).
pub(crate) mod human_opt {
    use serde::{Deserialize as _, Deserializer, Serializer};
    use std::time::Duration;

    pub(crate) fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => super::human::serialize(d, s),
            None => s.serialize_none(),
        }
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Duration>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|s| super::parse_duration(&s).map_err(serde::de::Error::custom))
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_each_unit() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("24h"), Ok(Duration::from_secs(86400)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86400)));
        assert!(parse_duration("5").is_err());
        assert!(parse_duration("m").is_err());
        assert!(parse_duration("5 parsecs").is_err());
        assert!(parse_duration("99999999999999999999d").is_err());
    }

    #[test]
    fn formats_in_the_largest_exact_unit() {
        for (d, text) in [
            (Duration::from_millis(200), "200ms"),
            (Duration::from_millis(1500), "1500ms"),
            (Duration::from_secs(1), "1s"),
            (Duration::from_secs(90), "90s"),
            (Duration::from_secs(120), "2m"),
            (Duration::from_secs(3600), "1h"),
            (Duration::from_secs(86400), "1d"),
            (Duration::ZERO, "0s"),
        ] {
            assert_eq!(format_duration(d).as_deref(), Ok(text));
            assert_eq!(parse_duration(text), Ok(d), "{text} reads back");
        }
        assert!(format_duration(Duration::from_micros(1500)).is_err());
    }
}
