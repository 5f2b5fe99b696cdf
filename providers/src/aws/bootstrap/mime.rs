//! MIME multipart archives, the envelope of AL2 and AL2023 user data (cloud-init and `nodeadm` read each
//! part by its content type).

use mail_parser::{MessageParser, MimeHeaders};

/// The boundary of the archives tenon writes.
pub const BOUNDARY: &str = "//";
/// A shell script part.
pub const SHELL: &str = "text/x-shellscript; charset=\"us-ascii\"";
/// A `nodeadm` `NodeConfig` part.
pub const NODE_CONFIG: &str = "application/node.eks.aws";

/// One part of an archive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// Its `Content-Type`.
    pub content_type: String,
    /// Its content.
    pub content: String,
}

/// Whether `user_data` is a MIME archive already (it starts with `MIME-Version:` or `Content-Type:`).
pub fn is_archive(user_data: &str) -> bool {
    let head = user_data.trim_start();
    head.starts_with("MIME-Version:") || head.starts_with("Content-Type:")
}

/// The parts of a MIME multipart archive, in order, their content decoded from any transfer encoding.
pub fn parse(archive: &str) -> Result<Vec<Part>, String> {
    let message = MessageParser::new().parse(archive).ok_or("userData: not a MIME message")?;
    let children = message.root_part().sub_parts().ok_or("userData: a MIME message, but not multipart")?;
    let mut parts = Vec::new();
    for id in children {
        let Some(part) = message.part(*id) else { continue };
        let content_type = match part.content_type() {
            Some(c) => {
                let mut t = match c.subtype() {
                    Some(sub) => format!("{}/{sub}", c.ctype()),
                    None => c.ctype().to_owned(),
                };
                if let Some(charset) = c.attribute("charset") {
                    t.push_str(&format!("; charset=\"{charset}\""));
                }
                t
            }
            None => "text/plain".to_owned(),
        };
        let content = String::from_utf8(part.contents().to_vec())
            .map_err(|_| format!("userData: the {content_type} part is not UTF-8 text"))?;
        parts.push(Part { content_type, content });
    }
    Ok(parts)
}

/// A multipart archive of `parts`, with line feeds only (as cloud-init and Karpenter write them).
pub fn serialize(parts: &[Part]) -> String {
    let mut out = format!("MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary=\"{BOUNDARY}\"\n\n");
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        out.push_str(&format!("--{BOUNDARY}\nContent-Type: {}\n\n{}", p.content_type, p.content));
    }
    out.push_str(&format!("\n--{BOUNDARY}--\n"));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn archives_round_trip_and_foreign_ones_parse() {
        let parts = vec![
            Part { content_type: SHELL.into(), content: "#!/bin/bash\necho hi\n".into() },
            Part {
                content_type: NODE_CONFIG.into(),
                content: "apiVersion: node.eks.aws/v1alpha1\nkind: NodeConfig\n".into(),
            },
        ];
        let text = serialize(&parts);
        assert!(is_archive(&text));
        let back = parse(&text).unwrap();
        assert_eq!(back.len(), 2);
        assert_eq!(back[0].content_type, SHELL);
        assert!(back[0].content.starts_with("#!/bin/bash\necho hi"));
        assert_eq!(back[1].content_type, NODE_CONFIG);
        // An archive written elsewhere: another boundary, CRLF line ends, a base64 part.
        let foreign = "MIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary=\"==X==\"\r\n\r\n--==X==\r\n\
            Content-Type: text/x-shellscript\r\nContent-Transfer-Encoding: base64\r\n\r\nZWNobyBvaw==\r\n--==X==--\r\n";
        let parts = parse(foreign).unwrap();
        assert_eq!(parts, [Part { content_type: "text/x-shellscript".into(), content: "echo ok".into() }]);
        assert!(parse("MIME-Version: 1.0\nContent-Type: text/plain\n\nhello").is_err());
    }
}
