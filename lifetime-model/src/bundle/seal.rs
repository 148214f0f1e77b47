//! Sealing a bundle changed by hand: its checksums written into the manifest, the rest of the
//! manifest's text kept byte for byte (a scan of its top-level members, not a rewrite).

use super::*;

/// Writes (or rewrites) the checksums of the bundle in `dir` into its manifest, after checking that
/// the bundle loads with them: for a bundle an operator changed by hand, or one written before
/// checksums existed. Returns the sealed manifest.
///
/// Only the manifest's `checksums` member changes: the rest of its text is kept byte for byte (a
/// parse and rewrite could move floats by an ulp). The manifest is replaced atomically.
pub fn seal(dir: impl AsRef<Path>, limits: &LoadLimits) -> Result<Manifest, BundleError> {
    let dir = dir.as_ref();
    let root = canonical_root(dir)?;
    let manifest_path = dir.join(MANIFEST_FILE);
    let original = read_confined(&manifest_path, &root, limits.max_manifest_bytes)?;
    let mut files = BundleFiles::read(dir, &LoadOptions { limits: *limits, confine_to: None })?;
    let checksums = files.checksums();
    let sealed_text = std::str::from_utf8(&original)
        .ok()
        .and_then(|text| with_checksums(text, &checksums))
        .ok_or_else(|| BundleError::Io {
            path: manifest_path.clone(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, "the manifest is not a JSON object"),
        })?;
    let sealed: Manifest = parse_json(&manifest_path, sealed_text.as_bytes())?;
    if sealed.checksums != checksums {
        return Err(BundleError::Io {
            path: manifest_path,
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, "the checksums could not be written"),
        });
    }
    files.manifest = sealed.clone();
    // Only a bundle that passes every other check is sealed.
    files.verify()?;
    LifetimeModel::from_files(dir, files)?;
    let staging = dir.join(format!(".{MANIFEST_FILE}.seal"));
    std::fs::write(&staging, sealed_text).map_err(|source| io_error(&staging, source))?;
    std::fs::rename(&staging, &manifest_path).map_err(|source| io_error(&manifest_path, source))?;
    Ok(sealed)
}

/// `manifest` (the text of a JSON object) with its top-level `checksums` member set to `checksums`:
/// replaced in place when present, appended otherwise. `None` if the text is not a JSON object.
pub(super) fn with_checksums(manifest: &str, checksums: &BTreeMap<String, String>) -> Option<String> {
    let entries: Vec<String> = checksums
        .iter()
        .map(|(file, checksum)| {
            format!("    {}: {}", serde_json::Value::from(file.as_str()), serde_json::Value::from(checksum.as_str()))
        })
        .collect();
    let object = format!("{{\n{}\n  }}", entries.join(",\n"));
    let members = top_level_members(manifest)?;
    let spliced = match members.members.iter().find(|member| member.key == "checksums") {
        Some(member) => format!("{}{object}{}", &manifest[..member.value.start], &manifest[member.value.end..]),
        None => {
            let close = members.close;
            let last = manifest[..close].trim_end().len();
            let separator = if members.members.is_empty() { "" } else { "," };
            format!("{}{separator}\n  \"checksums\": {object}\n{}", &manifest[..last], &manifest[close..])
        }
    };
    Some(spliced)
}

struct Member<'a> {
    key: &'a str,
    /// Byte range of the value, without surrounding whitespace.
    value: std::ops::Range<usize>,
}

struct TopLevel<'a> {
    members: Vec<Member<'a>>,
    /// Byte offset of the object's closing brace.
    close: usize,
}

/// Records the member `key` whose value spans `from..to` of `text` (with whitespace around it).
fn push_member<'a>(text: &'a str, members: &mut Vec<Member<'a>>, key: Option<&'a str>, from: Option<usize>, to: usize) {
    if let (Some(key), Some(from)) = (key, from) {
        let value = &text[from..to];
        let first = from + (value.len() - value.trim_start().len());
        let last = from + value.trim_end().len();
        members.push(Member { key, value: first..last });
    }
}

/// The top-level members of the JSON object `text`, by a scan that tracks strings and nesting only
/// (the text is parsed properly afterwards); `None` if `text` is not an object.
fn top_level_members(text: &str) -> Option<TopLevel<'_>> {
    let bytes = text.as_bytes();
    let start = bytes.iter().position(|b| !b.is_ascii_whitespace())?;
    if bytes[start] != b'{' {
        return None;
    }
    let (mut depth, mut in_string, mut escaped) = (1usize, false, false);
    let (mut expecting_key, mut key_start, mut key) = (true, None, None);
    let mut value_start: Option<usize> = None;
    let mut members = Vec::new();
    for (i, &byte) in bytes.iter().enumerate().skip(start + 1) {
        if in_string {
            if escaped {
                escaped = false;
            } else if byte == b'\\' {
                escaped = true;
            } else if byte == b'"' {
                in_string = false;
                if let Some(from) = key_start.take() {
                    key = Some(&text[from + 1..i]);
                }
            }
            continue;
        }
        match byte {
            b'"' => {
                in_string = true;
                if depth == 1 && expecting_key {
                    key_start = Some(i);
                    expecting_key = false;
                }
            }
            b':' if depth == 1 => value_start = Some(i + 1),
            b',' if depth == 1 => {
                push_member(text, &mut members, key.take(), value_start.take(), i);
                expecting_key = true;
            }
            b'{' | b'[' => depth += 1,
            b'}' | b']' => {
                depth -= 1;
                if depth == 0 {
                    push_member(text, &mut members, key.take(), value_start.take(), i);
                    return (byte == b'}').then_some(TopLevel { members, close: i });
                }
            }
            _ => {}
        }
    }
    None
}
