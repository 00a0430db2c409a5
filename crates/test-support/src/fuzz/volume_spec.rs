//! The options / YAML spec parsers on arbitrary text: PV and pod Volume manifests, Secret
//! manifests, and the options JSON a driver receives. Never panics; an accepted spec names a
//! valid driver; an error about a Secret never quotes the input's content.
use flexd::user_manifest;
use flexvolume_protocol::name::DriverName;
use flexvolume_protocol::options::Options;

/// Panics when an invariant breaks.
pub fn check(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok((spec, _secret_ref)) = user_manifest::volume_spec(text) {
        let name = spec.driver.to_string();
        assert_eq!(DriverName::parse(&name).as_ref(), Ok(&spec.driver));
    }
    match user_manifest::secret(text) {
        Ok((_name, values)) => assert!(!values.is_empty()),
        Err(e) => {
            // The message is one of a fixed set: it cannot carry a value from the input.
            let message = e.to_string();
            assert!(message.len() < 80, "{message}");
        }
    }
    if let Ok(options) = Options::from_json(text) {
        // What a driver parsed, the host serialises back to the same options.
        let again = Options::from_json(&options.to_json()).expect("own JSON parses");
        assert_eq!(again.to_json(), options.to_json());
    }
}
