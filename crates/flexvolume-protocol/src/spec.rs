//! What a volume is, as the lifecycle and the options builder see it: the fields of a
//! Kubernetes `flexVolume` source plus the volume's name. Pure data.

use std::collections::BTreeMap;
use std::fmt;

use crate::name::DriverName;

/// A FlexVolume volume: `driver`, `fsType`, `readOnly`, `options` and the resolved `secretRef`.
#[derive(Clone, PartialEq, Eq)]
pub struct VolumeSpec {
    /// The PV name or the pod volume name (`kubernetes.io/pvOrVolumeName`).
    pub volume_name: String,
    pub driver: DriverName,
    /// May be empty: the driver (or the format default) decides.
    pub fs_type: String,
    pub read_only: bool,
    pub options: BTreeMap<String, String>,
    /// Secret key → raw value. Never printed (see the Debug impl).
    pub secrets: BTreeMap<String, Vec<u8>>,
}

impl VolumeSpec {
    pub fn new(volume_name: String, driver: DriverName) -> Self {
        Self {
            volume_name,
            driver,
            fs_type: String::new(),
            read_only: false,
            options: BTreeMap::new(),
            secrets: BTreeMap::new(),
        }
    }
}

impl fmt::Debug for VolumeSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VolumeSpec")
            .field("volume_name", &self.volume_name)
            .field("driver", &self.driver)
            .field("fs_type", &self.fs_type)
            .field("read_only", &self.read_only)
            .field("options", &self.options)
            .field("secrets", &self.secrets.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// The pod a mount is for; all fields may be empty outside Kubernetes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodInfo {
    pub name: String,
    pub namespace: String,
    pub uid: String,
    pub service_account: String,
}

/// Sizes as Kubernetes quantities are commonly written: `1073741824`, `512Mi`, `1Gi`, `1G`.
/// Shared by `flexd volume expand --size` and the loop driver's `size` option. `None` for
/// text that is not such a quantity and for one past `u64` (tell them apart with
/// [`is_quantity_shaped`]).
pub fn parse_quantity(text: &str) -> Option<u64> {
    let (digits, factor) = split_quantity(text)?;
    digits.parse::<u64>().ok()?.checked_mul(factor)
}

/// Whether `text` is written as a quantity (digits, then a known unit or none), whatever its
/// value: a `size` that is such but does not parse is too big, not malformed.
pub fn is_quantity_shaped(text: &str) -> bool {
    split_quantity(text).is_some()
}

fn split_quantity(text: &str) -> Option<(&str, u64)> {
    const UNITS: [(&str, u64); 12] = [
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("Pi", 1 << 50),
        ("Ei", 1 << 60),
        ("k", 1_000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
        ("P", 1_000_000_000_000_000),
        ("E", 1_000_000_000_000_000_000),
    ];
    let (digits, factor) = UNITS
        .iter()
        .find_map(|(suffix, f)| text.strip_suffix(suffix).map(|d| (d, *f)))
        .unwrap_or((text, 1));
    let shaped = !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit());
    shaped.then_some((digits, factor))
}
