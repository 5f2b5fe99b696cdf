//! Image aliases (`family@version`), as the AWS and GCP NodeClasses name their images.

/// An image alias: a family and a version (`latest` when the alias names none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Alias {
    /// The family, as `families` spells it.
    pub family: String,
    /// `latest`, or a pinned version.
    pub version: String,
}

/// Parses `family@version` against the `families` a provider knows (compared without case when
/// `fold_case`, the family then taken as `families` spells it); the error names the alias and the families.
pub fn parse(alias: &str, families: &[&str], fold_case: bool) -> Result<Alias, String> {
    let (family, version) = alias.split_once('@').unwrap_or((alias, "latest"));
    let known = families.iter().find(|f| if fold_case { f.eq_ignore_ascii_case(family) } else { **f == family });
    let Some(known) = known else {
        return Err(format!("alias {alias:?}: unknown family {family:?} ({})", families.join(", ")));
    };
    if version.is_empty() {
        return Err(format!("alias {alias:?}: empty version"));
    }
    Ok(Alias { family: (*known).to_owned(), version: version.to_owned() })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn aliases_name_a_known_family_and_a_version() {
        assert_eq!(
            parse("AL2023", &["al2023"], true).unwrap(),
            Alias { family: "al2023".into(), version: "latest".into() }
        );
        assert!(parse("Ubuntu@v1", &["Ubuntu"], false).is_ok());
        assert!(parse("ubuntu@v1", &["Ubuntu"], false).unwrap_err().contains("unknown family"));
        assert!(parse("Ubuntu@", &["Ubuntu"], false).unwrap_err().contains("empty version"));
    }
}
