//! Fuzz the worker's edge: arbitrary bytes into the envelope parser (with and without the
//! secret), and every JSON value that parses into canonical JSON. Nothing may panic; a
//! parsed envelope must re-serialise to an envelope that parses to itself.
#![no_main]

use libfuzzer_sys::fuzz_target;
use oncely_core::canonical::canonical_string;
use oncely_core::intent::Envelope;
use oncely_core::KeyRing;

fuzz_target!(|data: &[u8]| {
    let secret = KeyRing::new(b"fuzz-secret".to_vec()).expect("secret");
    for s in [Some(&secret), None] {
        if let Ok(env) = Envelope::parse(data, 1 << 20, s) {
            let again = Envelope::parse(&env.to_bytes(), 1 << 20, s).expect("a parsed envelope re-parses");
            assert_eq!(again, env);
        }
    }
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(data)
        && let Ok(c) = canonical_string(&v)
    {
        let back: serde_json::Value = serde_json::from_str(&c).expect("canonical output is JSON");
        assert_eq!(canonical_string(&back).expect("stable"), c);
    }
});
