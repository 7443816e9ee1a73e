//! The Stripe profile (`config/providers/stripe.toml`) against `localstripe`, a fake
//! Stripe from PyPI that none of us wrote, through real worker processes.
//!
//! What localstripe does (checked by hand and by this test): it requires a secret key
//! (401 without), takes form-encoded PaymentIntent creation with `confirm` and
//! `metadata[…]`, and **ignores `Idempotency-Key`** — the same key twice creates two
//! payment intents. It has no search API (`/v1/payment_intents/search` is a 404) and its
//! list cannot filter by metadata. So against it the profile runs with `honours_key =
//! false` and a list lookup (`/v1/payment_intents?limit=100`, the item echoing our key);
//! everything else is the shipped profile. One charge per key then rests on oncely's
//! journal alone, which is what this test shows under repeats and redeliveries.

use oncely_core::Intent;
use oncely_core::config::{Config, ProviderConfig, ValueSource};
use oncely_tests::eventually;
use oncely_tests::fleet::{FAST_RECONCILER, Fleet, FleetOptions, secret};
use oncely_tests::localstripe::Localstripe;
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(90);
const ACTION: &str = "payment_intent.create";

/// localstripe's URL and the secret key file, for [`stripe_profile`] (a plain `fn`).
static STRIPE: OnceLock<(String, PathBuf)> = OnceLock::new();

/// The fleet's config plus the shipped Stripe profile, pointed at localstripe, and an
/// action that uses it.
fn stripe_profile(config: &mut Config) {
    let (url, key_file) = STRIPE.get().expect("set before the fleet");
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../config/providers/stripe.toml"
    );
    let text = std::fs::read_to_string(path).expect("the profile");
    let profile = Config::from_toml(&text, path, std::iter::empty()).expect("a valid profile");
    let Some(ProviderConfig::Http(mut stripe)) = profile.providers.get("stripe").cloned() else {
        panic!("the profile defines providers.stripe");
    };
    // What localstripe lacks (see the module docs); nothing else is changed.
    stripe.base_url = url.clone();
    stripe.honours_key = false;
    stripe.lookup_path = "/v1/payment_intents?limit=100".into();
    // Short enough for the test's 5 s lease (a lease must outlast the call).
    stripe.timeout = Duration::from_secs(3);
    // The key file of this test instead of /run/secrets.
    if let Some(basic) = stripe.basic_auth.as_mut() {
        basic.username = ValueSource::File {
            path: key_file.clone(),
            prefix: String::new(),
        };
    }
    config
        .providers
        .insert("stripe".into(), ProviderConfig::Http(stripe));
    let mut policy = config.actions["payment_order.create"].clone();
    policy.provider = "stripe".into();
    config.actions.insert(ACTION.into(), policy);
}

fn intent(n: usize, payment_method: &str) -> Intent {
    Intent::from_json(json!({
        "action_type": ACTION, "workflow_id": "checkout", "step": "charge",
        "business_object": format!("cart-{n}"), "revision": 1,
        "payload": {"amount_minor": 1000 + n, "currency": "eur",
                    "payment_method": payment_method, "business_reference": format!("cart-{n}")}
    }))
    .expect("intent")
}

/// One test, three acts (one localstripe): a charge whose answer was lost is found by
/// the reconciler's lookup instead of charged again; repeats and redeliveries charge once;
/// a payload the profile cannot map is refused with nothing sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payments_through_the_stripe_profile_are_charged_once_at_localstripe() {
    let mut stripe = Localstripe::start().await;
    let dir = std::env::temp_dir().join(oncely_tests::unique_name("stripe"));
    std::fs::create_dir_all(&dir).expect("dir");
    let key_file = dir.join("stripe_secret_key");
    std::fs::write(&key_file, format!("{}\n", stripe.secret_key)).expect("key file");
    STRIPE
        .set((stripe.url(), key_file))
        .expect("one stripe test per process");
    let fleet = Fleet::with(FleetOptions {
        configure: Some(stripe_profile),
        reconciler: Some(FAST_RECONCILER),
        lease: "5s".into(),
        timeout: "3s".into(),
        ..FleetOptions::default()
    })
    .await;
    let card = stripe.card().await;
    let _reconciler = fleet.reconciler();

    // Act 1: the worker dies right after localstripe answered (the PaymentIntent exists,
    // nothing is committed). The lease runs out, the operation is unknown, and the
    // reconciler finds the PaymentIntent by the key in its metadata: succeeded, with
    // that id — localstripe would have charged a blind retry again.
    let failpoint_worker = oncely_tests::failpoint_worker::path().expect("fail-point worker");
    let first = intent(0, &card);
    let key = first.clone().seal(&secret()).expect("seal").key;
    let crashing = fleet.spawn_program(
        &failpoint_worker,
        &["run"],
        &[("ONCELY_FAILPOINTS", "after_provider=1.0")],
    );
    fleet
        .producer()
        .await
        .enqueue(first)
        .await
        .expect("enqueue");
    let mut crashing = crashing;
    tokio::time::timeout(DEADLINE, crashing.child.wait())
        .await
        .expect("the fail-point worker aborts after the call")
        .expect("wait");
    eventually("the lost answer is reconciled", DEADLINE, || async {
        (fleet.count("succeeded").await == 1).then_some(())
    })
    .await;
    let charged = stripe.payment_intents().await;
    assert_eq!(charged.len(), 1, "charged once: {charged:?}");
    assert_eq!(charged[0]["metadata"]["oncely_key"], json!(key.as_str()));
    let op = fleet.op(&key).await.expect("row");
    assert_eq!(
        op.provider_operation_id.as_deref(),
        charged[0]["id"].as_str()
    );
    assert_eq!(op.attempt_count, 1, "never executed twice");

    // Act 2: 12 payments (the first among them again) with repeats and redeliveries.
    let _procs = [fleet.worker(), fleet.worker()];

    // 12 payments, each enqueued twice by two producers at once, and 3 of them also
    // published raw 5 times (redeliveries with no SDK in between).
    let n = 12;
    let intents: Vec<Intent> = (0..n).map(|i| intent(i, &card)).collect();
    let new = fleet
        .enqueue_from_two(intents.clone(), intents.clone())
        .await;
    assert_eq!(
        new,
        n - 1,
        "each payment recorded once (the first one was already)"
    );
    for i in intents.iter().take(3) {
        let bytes = i.clone().seal(&secret()).expect("seal").to_bytes();
        for _ in 0..5 {
            fleet.publish_raw(ACTION, &bytes).await;
        }
    }
    eventually("every payment succeeded", DEADLINE, || async {
        (fleet.count("succeeded").await == n as i64).then_some(())
    })
    .await;

    // localstripe's own record: one payment intent per key, the one the journal names.
    let charged = stripe.payment_intents().await;
    assert_eq!(charged.len(), n, "one payment intent per payment");
    let by_key: BTreeMap<String, &Value> = charged
        .iter()
        .map(|pi| {
            let key = pi["metadata"]["oncely_key"].as_str().unwrap_or_default();
            (key.to_owned(), pi)
        })
        .collect();
    assert_eq!(by_key.len(), n, "no key charged twice");
    let journal: Vec<(String, Option<String>)> = sqlx::query_as(
        "SELECT idempotency_key, provider_operation_id FROM agent_operations WHERE action_type = $1",
    )
    .bind(ACTION)
    .fetch_all(&fleet.db.pool)
    .await
    .expect("journal");
    for (key, id) in &journal {
        let pi = by_key
            .get(key)
            .unwrap_or_else(|| panic!("{key} not charged"));
        assert_eq!(pi["id"].as_str(), id.as_deref(), "{key}");
        assert_eq!(pi["status"], json!("succeeded"), "{key}");
    }
    let amounts: BTreeSet<u64> = charged
        .iter()
        .filter_map(|pi| pi["amount"].as_u64())
        .collect();
    assert_eq!(amounts, (0..n as u64).map(|i| 1000 + i).collect());

    // Act 3: a payment without the payment method the profile's body needs: failed for good,
    // nothing sent to Stripe.
    let mut incomplete = intent(99, &card);
    incomplete.payload.remove("payment_method");
    fleet
        .producer()
        .await
        .enqueue(incomplete)
        .await
        .expect("enqueue");
    let code = eventually("the incomplete payment failed", DEADLINE, || async {
        let code: Option<Option<String>> = sqlx::query_scalar(
            "SELECT last_error_code FROM agent_operations WHERE status = 'failed_final'",
        )
        .fetch_optional(&fleet.db.pool)
        .await
        .expect("query");
        code.flatten()
    })
    .await;
    assert_eq!(code, "template_missing_field");
    assert_eq!(
        stripe.payment_intents().await.len(),
        n,
        "nothing more charged"
    );
    assert!(stripe.running(), "localstripe stayed up");
}
