//! The CSI name of a FlexVolume driver: a documented, valid, reversible rule.
//!
//! CSI driver names must be at most 63 characters of `[a-z0-9.-]` in domain-name notation
//! (beginning and ending alphanumeric), while FlexVolume names allow capitals, `_` and `/`.
//! The rule: `flexvolume-` followed by the driver name with
//!
//! | in the driver name | in the CSI name |
//! |---|---|
//! | `a`-`z`, `0`-`9`, `.` | itself |
//! | `/` | `--` |
//! | `-` | `-0` |
//! | `_` | `-1` |
//! | `A`-`Z` | `-` and the lower-case letter |
//!
//! so `acme/nfs` is `flexvolume-acme--nfs` and `k8s.io/NFS_v2` is `flexvolume-k8s.io---n-f-s-1v2`.
//! Every escape starts with `-` and is two characters long, so decoding is unambiguous. A name
//! whose CSI form would be longer than 63 characters or not a DNS-1123 subdomain (`a..b`, a
//! trailing `.`, a label starting with an escape such as `a./b`) is not served through CSI; flexd reports it.

use flexvolume_host::DriverName;

pub(crate) const PREFIX: &str = "flexvolume-";
pub(crate) const MAX_CSI_NAME_LEN: usize = 63;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CsiNameError {
    #[error(
        "the CSI name of driver {driver} would be {len} characters; CSI allows {MAX_CSI_NAME_LEN}"
    )]
    TooLong { driver: String, len: usize },
    #[error("the CSI name {csi_name:?} of driver {driver} is not a valid domain name")]
    NotADomainName { driver: String, csi_name: String },
    #[error("{0:?} is not a flexd CSI name")]
    NotOurs(String),
}

/// The CSI name serving `driver`.
pub fn csi_name(driver: &DriverName) -> Result<String, CsiNameError> {
    let mut out = String::from(PREFIX);
    for c in driver.as_str().chars() {
        match c {
            'a'..='z' | '0'..='9' | '.' => out.push(c),
            '/' => out.push_str("--"),
            '-' => out.push_str("-0"),
            '_' => out.push_str("-1"),
            'A'..='Z' => {
                out.push('-');
                out.push(c.to_ascii_lowercase());
            }
            // DriverName admits nothing else.
            _ => {
                return Err(CsiNameError::NotADomainName {
                    driver: driver.to_string(),
                    csi_name: out,
                })
            }
        }
    }
    if out.len() > MAX_CSI_NAME_LEN {
        return Err(CsiNameError::TooLong {
            driver: driver.to_string(),
            len: out.len(),
        });
    }
    if !is_dns_subdomain(&out) {
        return Err(CsiNameError::NotADomainName {
            driver: driver.to_string(),
            csi_name: out,
        });
    }
    Ok(out)
}

/// DNS-1123 subdomain labels: non-empty, `[a-z0-9-]`, starting and ending alphanumeric.
fn is_dns_subdomain(name: &str) -> bool {
    name.split('.').all(|label| {
        let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
        alnum(label.chars().next()) && alnum(label.chars().last())
    })
}

/// The driver served under a CSI name (the inverse of [`csi_name`]).
pub fn driver_name(csi_name: &str) -> Result<DriverName, CsiNameError> {
    let not_ours = || CsiNameError::NotOurs(csi_name.to_owned());
    let encoded = csi_name.strip_prefix(PREFIX).ok_or_else(not_ours)?;
    let mut name = String::with_capacity(encoded.len());
    let mut chars = encoded.chars();
    while let Some(c) = chars.next() {
        if c != '-' {
            name.push(c);
            continue;
        }
        match chars.next() {
            Some('-') => name.push('/'),
            Some('0') => name.push('-'),
            Some('1') => name.push('_'),
            Some(l @ 'a'..='z') => name.push(l.to_ascii_uppercase()),
            _ => return Err(not_ours()),
        }
    }
    let driver = DriverName::parse(&name).map_err(|_| not_ours())?;
    // Only the canonical spelling is ours (e.g. not one that csi_name would refuse).
    match self::csi_name(&driver) {
        Ok(canonical) if canonical == csi_name => Ok(driver),
        _ => Err(not_ours()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(name: &str) -> String {
        let driver = DriverName::parse(name).unwrap();
        let csi = csi_name(&driver).unwrap();
        assert_eq!(driver_name(&csi).unwrap(), driver, "{name} -> {csi}");
        assert!(csi.len() <= MAX_CSI_NAME_LEN);
        assert!(csi
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '-'));
        csi
    }

    #[test]
    fn documented_examples() {
        for (driver, csi) in [
            ("acme/nfs", "flexvolume-acme--nfs"),
            ("k8s.io/NFS_v2", "flexvolume-k8s.io---n-f-s-1v2"),
            ("nfs", "flexvolume-nfs"),
            ("my-vendor/x", "flexvolume-my-0vendor--x"),
            ("flexd/loop", "flexvolume-flexd--loop"),
        ] {
            assert_eq!(round_trip(driver), csi);
        }
    }

    #[test]
    fn every_character_class_round_trips() {
        for name in [
            "a/b/c",
            "A",
            "a-",
            "a_",
            "Z9/_x-y.z",
            "x.y.z/q",
            "UPPER/lower",
        ] {
            round_trip(name);
        }
    }

    #[test]
    fn names_that_cannot_be_csi_names_are_refused_clearly() {
        let long = DriverName::parse(&"a".repeat(60)).unwrap();
        assert!(matches!(csi_name(&long), Err(CsiNameError::TooLong { .. })));
        let dots = DriverName::parse("a..b").unwrap();
        assert!(matches!(
            csi_name(&dots),
            Err(CsiNameError::NotADomainName { .. })
        ));
        for name in ["a.", "a./b", "a._x", "a.-b", "a.B"] {
            let driver = DriverName::parse(name).unwrap();
            assert!(
                matches!(csi_name(&driver), Err(CsiNameError::NotADomainName { .. })),
                "{name}"
            );
        }
    }

    #[test]
    fn foreign_names_are_not_decoded() {
        assert_eq!(driver_name("flexvolume--z9").unwrap().as_str(), "Z9");
        for csi in [
            "ebs.csi.aws.com",
            "flexvolume-a-",
            "flexvolume-a-x-",
            "flexvolume-a.-z9",
            "flexvolume-",
        ] {
            assert!(driver_name(csi).is_err(), "{csi}");
        }
    }
}
