//! What a provider's answer says about its limits: `Retry-After`, the IETF `RateLimit` /
//! `RateLimit-Policy` fields, and the common `X-RateLimit-Remaining` / `-Reset`.
//!
//! Why the adapter reads them on every answer, not only on a 429: a provider that
//! announces "0 left, the window resets in 3 s" on a 200 is telling the fleet to stop
//! *before* the next call is refused. What is read becomes a [`Pushback`]; the worker's
//! flow control turns it into a fleet-wide pause or rate (worker/src/flow.rs). Parsing is
//! lenient — a field that does not parse is ignored, never an error — and bounded: no wait
//! longer than [`MAX_WAIT`] is believed.

use hyper::HeaderMap;
use std::time::{Duration, SystemTime};

/// The longest wait a provider's header can impose (longer values are capped).
pub const MAX_WAIT: Duration = Duration::from_secs(3600);

/// What an answer said about the provider's limits.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Pushback {
    /// Do not call again before this long from now (`Retry-After`, or a spent window's
    /// reset).
    pub wait: Option<Duration>,
    /// Whether `wait` came from a `Retry-After` field (a 503 is a throttle only with one).
    pub retry_after: bool,
    /// The limit the provider announced, in requests per second (`RateLimit-Policy`).
    pub limit_per_second: Option<f64>,
}

impl Pushback {
    /// Whether the answer said anything about limits.
    pub fn is_empty(&self) -> bool {
        self.wait.is_none() && self.limit_per_second.is_none()
    }

    /// Read the fields of an answer received at `now`.
    pub fn from_headers(headers: &HeaderMap, now: SystemTime) -> Self {
        let text = |name: &str| {
            headers
                .get_all(name)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let retry_after = headers
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| retry_after(v, now));
        let mut p = Pushback {
            wait: retry_after,
            retry_after: retry_after.is_some(),
            limit_per_second: None,
        };
        let policy = text("ratelimit-policy");
        if !policy.is_empty() {
            p.limit_per_second = policy_rate(&policy);
        }
        // A spent window: remaining 0, reset in t seconds (IETF `RateLimit`, its older
        // split fields, and the common `X-RateLimit-*`).
        let spent = {
            let combined = text("ratelimit");
            let fields = if combined.is_empty() {
                None
            } else {
                ratelimit_field(&combined)
            };
            fields
                .or_else(|| {
                    split_fields(&text("ratelimit-remaining"), &text("ratelimit-reset"), now)
                })
                .or_else(|| {
                    split_fields(
                        &text("x-ratelimit-remaining"),
                        &text("x-ratelimit-reset"),
                        now,
                    )
                })
        };
        if let Some(reset) = spent
            && p.wait.is_none_or(|w| w < reset)
        {
            p.wait = Some(reset);
        }
        p.wait = p.wait.map(|w| w.min(MAX_WAIT));
        p
    }
}

/// `Retry-After`: delay-seconds or an HTTP-date (RFC 9110, 10.2.3).
fn retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs).min(MAX_WAIT));
    }
    let at = chrono::DateTime::parse_from_rfc2822(value).ok()?;
    let at = SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(at.timestamp()).ok()?);
    Some(
        at.duration_since(now)
            .unwrap_or(Duration::ZERO)
            .min(MAX_WAIT),
    )
}

/// The parameters of a structured-field list item (`"default";q=50;w=1` or
/// `limit=50, remaining=0, reset=1`): `(key, number)` pairs; a bare number is `q`.
fn params(item: &str) -> Vec<(String, f64)> {
    item.split(';')
        .filter_map(|part| {
            let part = part.trim();
            match part.split_once('=') {
                Some((k, v)) => Some((
                    k.trim().to_ascii_lowercase(),
                    v.trim().trim_matches('"').parse().ok()?,
                )),
                None => Some(("q".into(), part.parse().ok()?)),
            }
        })
        .collect()
}

fn get(ps: &[(String, f64)], names: &[&str]) -> Option<f64> {
    ps.iter()
        .find(|(k, _)| names.contains(&k.as_str()))
        .map(|(_, v)| *v)
}

/// The lowest rate any policy item announces: quota `q` per window `w` seconds (`w`
/// defaults to 1 in the drafts' examples of a bare quota).
fn policy_rate(policy: &str) -> Option<f64> {
    policy
        .split(',')
        .filter_map(|item| {
            let ps = params(item);
            let q = get(&ps, &["q", "limit"])?;
            let w = get(&ps, &["w", "window"]).unwrap_or(1.0);
            (q > 0.0 && w > 0.0).then_some(q / w)
        })
        .min_by(f64::total_cmp)
}

/// `RateLimit: limit=50, remaining=0, reset=1` (draft 7) or `"default";r=0;t=1` (later
/// drafts): when nothing remains, the reset.
fn ratelimit_field(value: &str) -> Option<Duration> {
    // Draft 7 puts the members in one comma-separated dictionary; later drafts put one
    // list item per policy with `;` parameters. Both read as one bag of parameters.
    let bag: Vec<(String, f64)> = value.split(',').flat_map(params).collect();
    let remaining = get(&bag, &["r", "remaining"])?;
    let reset = get(&bag, &["t", "reset"])?;
    (remaining <= 0.0 && reset >= 0.0)
        .then(|| Duration::from_secs_f64(reset.min(MAX_WAIT.as_secs_f64())))
}

/// `X-RateLimit-Remaining: 0` with `X-RateLimit-Reset` in seconds, or as a Unix time
/// (a value above a billion seconds is a date, as GitHub sends it).
fn split_fields(remaining: &str, reset: &str, now: SystemTime) -> Option<Duration> {
    let remaining: f64 = remaining.split(',').next()?.trim().parse().ok()?;
    let reset: f64 = reset.split(',').next()?.trim().parse().ok()?;
    if remaining > 0.0 || !reset.is_finite() || reset < 0.0 {
        return None;
    }
    let wait = if reset > 1e9 {
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs_f64(reset);
        at.duration_since(now).unwrap_or(Duration::ZERO)
    } else {
        Duration::from_secs_f64(reset)
    };
    Some(wait.min(MAX_WAIT))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::{HeaderName, HeaderValue};

    fn read(fields: &[(&str, &str)]) -> Pushback {
        let mut h = HeaderMap::new();
        for (k, v) in fields {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).expect("name"),
                HeaderValue::from_str(v).expect("value"),
            );
        }
        // 2015-10-21T07:28:00Z minus 10 s.
        Pushback::from_headers(
            &h,
            SystemTime::UNIX_EPOCH + Duration::from_secs(1_445_412_470),
        )
    }

    #[test]
    fn retry_after_in_seconds_or_as_a_date() {
        let p = read(&[("Retry-After", "2")]);
        assert_eq!(
            (p.wait, p.retry_after),
            (Some(Duration::from_secs(2)), true)
        );
        let p = read(&[("Retry-After", "Wed, 21 Oct 2015 07:28:00 GMT")]);
        assert_eq!(p.wait, Some(Duration::from_secs(10)));
        // In the past: no wait beyond now.
        let p = read(&[("Retry-After", "Wed, 21 Oct 2015 07:00:00 GMT")]);
        assert_eq!(p.wait, Some(Duration::ZERO));
        assert_eq!(read(&[("Retry-After", "soon")]), Pushback::default());
        assert_eq!(read(&[("Retry-After", "99999999")]).wait, Some(MAX_WAIT));
    }

    #[test]
    fn the_ietf_fields_old_and_new() {
        let p = read(&[
            ("RateLimit-Policy", "50;w=1"),
            ("RateLimit", "limit=50, remaining=0, reset=3"),
        ]);
        assert_eq!(p.limit_per_second, Some(50.0));
        assert_eq!(
            (p.wait, p.retry_after),
            (Some(Duration::from_secs(3)), false)
        );
        let p = read(&[
            (
                "RateLimit-Policy",
                "\"burst\";q=100;w=60, \"daily\";q=1000;w=86400",
            ),
            ("RateLimit", "\"burst\";r=5;t=30"),
        ]);
        assert!((p.limit_per_second.expect("rate") - 1000.0 / 86400.0).abs() < 1e-9);
        assert_eq!(p.wait, None, "5 remain");
        let p = read(&[("RateLimit", "\"default\";r=0;t=2")]);
        assert_eq!(p.wait, Some(Duration::from_secs(2)));
        let p = read(&[("RateLimit-Remaining", "0"), ("RateLimit-Reset", "4")]);
        assert_eq!(p.wait, Some(Duration::from_secs(4)));
    }

    #[test]
    fn the_x_ratelimit_fields_in_seconds_or_as_a_unix_time() {
        let p = read(&[("X-RateLimit-Remaining", "0"), ("X-RateLimit-Reset", "5")]);
        assert_eq!(p.wait, Some(Duration::from_secs(5)));
        let p = read(&[
            ("X-RateLimit-Remaining", "0"),
            ("X-RateLimit-Reset", "1445412490"),
        ]);
        assert_eq!(p.wait, Some(Duration::from_secs(20)));
        let p = read(&[("X-RateLimit-Remaining", "12"), ("X-RateLimit-Reset", "5")]);
        assert!(p.is_empty());
    }

    #[test]
    fn the_longer_of_retry_after_and_a_spent_window_wins() {
        let p = read(&[
            ("Retry-After", "1"),
            ("X-RateLimit-Remaining", "0"),
            ("X-RateLimit-Reset", "7"),
        ]);
        assert_eq!(
            (p.wait, p.retry_after),
            (Some(Duration::from_secs(7)), true)
        );
    }
}
