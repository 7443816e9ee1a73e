//! The three outside systems the sandbox imitates.
//!
//! Why a type: every other part (stores, id sequences, fault filters, stats,
//! lookup switches) is keyed by provider, and a closed enum makes a typo in a
//! fault config a 400 instead of a rule that silently never matches.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// One imitated outside provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Provider {
    /// Mail API: `POST /v1/emails`, ids `em_…`.
    Mail,
    /// Ticketing API: `POST /v1/tickets`, ids `tk_…`.
    Tickets,
    /// Bank API: `POST /v1/payment-orders`, ids `po_…`.
    Bank,
}

impl Provider {
    /// Every provider, in a fixed order.
    pub const ALL: [Provider; 3] = [Provider::Mail, Provider::Tickets, Provider::Bank];

    /// The name used in fault configs, stats and effects (`mail`, `tickets`, `bank`).
    pub fn name(self) -> &'static str {
        match self {
            Provider::Mail => "mail",
            Provider::Tickets => "tickets",
            Provider::Bank => "bank",
        }
    }

    /// The path segment after `/v1/` (`emails`, `tickets`, `payment-orders`).
    pub fn resource(self) -> &'static str {
        match self {
            Provider::Mail => "emails",
            Provider::Tickets => "tickets",
            Provider::Bank => "payment-orders",
        }
    }

    /// The collection path, e.g. `/v1/payment-orders`.
    pub fn path(self) -> String {
        format!("/v1/{}", self.resource())
    }

    /// Prefix of the ids this provider hands out (`em_`, `tk_`, `po_`).
    pub fn id_prefix(self) -> &'static str {
        match self {
            Provider::Mail => "em_",
            Provider::Tickets => "tk_",
            Provider::Bank => "po_",
        }
    }

    /// The provider serving a `/v1/<resource>` segment.
    pub fn from_resource(resource: &str) -> Option<Provider> {
        Provider::ALL.into_iter().find(|p| p.resource() == resource)
    }

    /// Position in [`Provider::ALL`], for per-provider arrays.
    pub(crate) fn index(self) -> usize {
        match self {
            Provider::Mail => 0,
            Provider::Tickets => 1,
            Provider::Bank => 2,
        }
    }
}

impl fmt::Display for Provider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Provider {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Provider::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| format!("unknown provider {s:?} (expected mail, tickets or bank)"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_resources_round_trip() {
        for p in Provider::ALL {
            assert_eq!(p.name().parse::<Provider>().unwrap(), p);
            assert_eq!(Provider::from_resource(p.resource()), Some(p));
            assert_eq!(Provider::ALL[p.index()], p);
            assert_eq!(serde_json::to_value(p).unwrap(), p.name());
        }
        assert!("paypal".parse::<Provider>().is_err());
        assert_eq!(Provider::from_resource("refunds"), None);
    }
}
