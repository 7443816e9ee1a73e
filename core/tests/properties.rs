//! Property tests for the cross-language contract: keys, hashes, canonical JSON and the
//! envelope parser. Arbitrary input never panics; equal identities give equal keys
//! whatever the field order; any change to an identity field changes the key; and our
//! canonical JSON is byte-for-byte CPython's (checked against a real `python3`).

use oncely_core::canonical::canonical_string;
use oncely_core::intent::{DEFAULT_MAX_ENVELOPE_BYTES, Envelope, Intent};
use oncely_core::{BusinessIdentity, KeyRing, PayloadHash};
use proptest::prelude::*;
use serde_json::{Map, Value, json};

fn secret() -> KeyRing {
    KeyRing::new(b"test-secret-do-not-use".to_vec()).expect("secret")
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z0-9_-]{1,12}",
        "\\PC{1,8}", // any printable unicode
        proptest::collection::vec(any::<char>(), 1..6).prop_map(|c| c.into_iter().collect()),
    ]
}

fn identity_fields() -> impl Strategy<Value = (String, String, String, String, i64, Option<String>)>
{
    (
        "[a-z][a-z0-9_]{0,8}(\\.[a-z][a-z0-9_]{0,8}){0,2}",
        text(),
        text(),
        text(),
        any::<i64>(),
        proptest::option::of(text()),
    )
}

fn identity_json(
    f: &(String, String, String, String, i64, Option<String>),
) -> Vec<(String, Value)> {
    let mut v = vec![
        ("action_type".to_owned(), json!(f.0)),
        ("workflow_id".to_owned(), json!(f.1)),
        ("step".to_owned(), json!(f.2)),
        ("business_object".to_owned(), json!(f.3)),
        ("revision".to_owned(), json!(f.4)),
    ];
    if let Some(t) = &f.5 {
        v.push(("tenant".to_owned(), json!(t)));
    }
    v
}

/// Arbitrary JSON values (finite floats only: NaN has no JSON form).
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        text().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::btree_map(text(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]

    #[test]
    fn same_identity_same_key_whatever_the_field_order(f in identity_fields(), seed in any::<u64>()) {
        let mut fields = identity_json(&f);
        let a: Map<String, Value> = fields.iter().cloned().collect();
        // Reorder deterministically by the seed and rebuild the object from text, so the
        // order really reaches the parser.
        let n = fields.len();
        fields.rotate_left((seed % n as u64) as usize);
        if seed & 1 == 1 { fields.reverse(); }
        let text = format!("{{{}}}", fields.iter().map(|(k, v)| format!("{}:{}", json!(k), v)).collect::<Vec<_>>().join(","));
        let b: Map<String, Value> = serde_json::from_str(&text).expect("json");
        let ka = secret().key_for(&BusinessIdentity::from_json(&a).expect("a"));
        let kb = secret().key_for(&BusinessIdentity::from_json(&b).expect("b"));
        prop_assert_eq!(ka, kb);
    }

    #[test]
    fn any_change_to_an_identity_field_changes_the_key(f in identity_fields(), which in 0usize..6, other in identity_fields()) {
        let base = BusinessIdentity::from_json(&identity_json(&f).into_iter().collect()).expect("base");
        let mut changed = base.clone();
        match which {
            0 => changed.action_type = oncely_core::ActionType::parse(&other.0).expect("type"),
            1 => changed.workflow_id = other.1.clone(),
            2 => changed.step = other.2.clone(),
            3 => changed.business_object = other.3.clone(),
            4 => changed.revision = other.4,
            _ => changed.tenant = other.5.clone(),
        }
        prop_assume!(changed != base);
        prop_assert_ne!(secret().key_for(&base), secret().key_for(&changed));
    }

    #[test]
    fn canonical_json_is_stable_under_reordering_and_round_trips(v in json_value()) {
        let s = canonical_string(&v).expect("canonical");
        let back: Value = serde_json::from_str(&s).expect("canonical output is JSON");
        prop_assert_eq!(&back, &v);
        prop_assert_eq!(canonical_string(&back).expect("again"), s);
    }

    #[test]
    fn arbitrary_bytes_never_panic_the_envelope_parser(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = Envelope::parse(&bytes, DEFAULT_MAX_ENVELOPE_BYTES, Some(&secret()));
    }

    #[test]
    fn arbitrary_json_gets_a_typed_error_or_a_valid_envelope(v in json_value()) {
        let bytes = serde_json::to_vec(&v).expect("json");
        match Envelope::parse(&bytes, DEFAULT_MAX_ENVELOPE_BYTES, Some(&secret())) {
            Ok(env) => prop_assert_eq!(env.payload_hash.clone(), PayloadHash::of(&Value::Object(env.intent.payload.clone())).expect("hash")),
            Err(e) => prop_assert!(!e.reason().is_empty()),
        }
    }

    #[test]
    fn valid_intents_with_mutations_are_refused_or_equal(f in identity_fields(), payload in proptest::collection::btree_map("[a-z]{1,6}", json_value(), 0..4), tweak in 0usize..4) {
        let mut obj: Map<String, Value> = identity_json(&f).into_iter().collect();
        obj.insert("payload".into(), Value::Object(payload.into_iter().collect()));
        let env = Intent::from_json(Value::Object(obj)).expect("intent").seal(&secret()).expect("seal");
        let mut wire = env.to_json();
        let m = wire.as_object_mut().expect("object");
        match tweak {
            0 => {}
            1 => { m.insert("revision".into(), json!(f.4.wrapping_add(1))); }
            2 => { m.get_mut("payload").and_then(Value::as_object_mut).expect("payload").insert("zz_extra".into(), json!(1)); }
            _ => { m.insert("idempotency_key".into(), json!(format!("v1:{}", "0".repeat(64)))); }
        }
        let parsed = Envelope::parse(&serde_json::to_vec(&wire).expect("json"), DEFAULT_MAX_ENVELOPE_BYTES, Some(&secret()));
        if tweak == 0 { prop_assert_eq!(parsed.expect("valid"), env); } else { prop_assert!(parsed.is_err()); }
    }
}

/// CPython is the reference implementation of the contract: feed it many random values
/// and compare its bytes with ours. Requires `python3` (present on every machine this
/// project runs its CI on); the test fails, rather than skips, without it.
#[test]
fn canonical_json_matches_cpython_byte_for_byte() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    use std::io::Write;
    use std::process::{Command, Stdio};

    let mut runner = TestRunner::deterministic();
    let strategy = json_value();
    let values: Vec<Value> = (0..400)
        .map(|_| strategy.new_tree(&mut runner).expect("value").current())
        .collect();
    let mut child = Command::new("python3")
        .args([
            "-c",
            "import sys, json\nfor line in sys.stdin:\n    v = json.loads(line)\n    sys.stdout.write(json.dumps(v, sort_keys=True, separators=(',', ':'), ensure_ascii=False) + '\\n')\n",
        ])
        .env("PYTHONIOENCODING", "utf-8")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 is required for the cross-language check");
    let mut input = String::new();
    for v in &values {
        input.push_str(&serde_json::to_string(v).expect("json"));
        input.push('\n');
    }
    let mut stdin = child.stdin.take().expect("stdin");
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()).expect("write"));
    let out = child.wait_with_output().expect("python output");
    writer.join().expect("writer");
    assert!(out.status.success(), "python3 failed");
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), values.len());
    for (v, py) in values.iter().zip(lines) {
        assert_eq!(canonical_string(v).expect("canonical"), py, "value {v}");
    }
}
