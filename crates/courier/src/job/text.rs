//! Binary values through text key-value stores (PMI-1 and PMI-2).
//!
//! Those stores take printable values of bounded length with no spaces, `;` or `=`, and
//! keys of bounded length. Courier's values are bytes of any length: they are encoded in
//! base64 (the URL alphabet, no padding) and cut into chunks. A value is stored as its first
//! chunk under the key itself, prefixed with the chunk count (`3:...`), and the rest under
//! `key#1`, `key#2`, ...; a key names its rank (`c<rank>.<user key>`), because these stores
//! have one namespace for the whole job.

use crate::base::{Error, Result, Status};

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// Most chunks one value may take (a bound on what a peer's count can make us fetch).
pub const MAX_CHUNKS: usize = 4096;

/// Base64 (URL alphabet, no padding) of `data`.
pub fn encode(data: &[u8]) -> String {
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for c in data.chunks(3) {
        let n = (c[0] as u32) << 16
            | (c.get(1).copied().unwrap_or(0) as u32) << 8
            | c.get(2).copied().unwrap_or(0) as u32;
        let chars = c.len() + 1;
        for i in 0..chars {
            out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out
}

fn sextet(b: u8) -> Option<u32> {
    Some(match b {
        b'A'..=b'Z' => b - b'A',
        b'a'..=b'z' => b - b'a' + 26,
        b'0'..=b'9' => b - b'0' + 52,
        b'-' => 62,
        b'_' => 63,
        _ => return None,
    } as u32)
}

/// The bytes `encode` made `text` from; an error names the first bad character.
pub fn decode(text: &str) -> Result<Vec<u8>> {
    let b = text.as_bytes();
    if b.len() % 4 == 1 {
        return Err(Error::msg(
            Status::ProtocolError,
            format!(
                "a value from the launcher is not base64: its length {} is impossible",
                b.len()
            ),
        ));
    }
    let mut out = Vec::with_capacity(b.len() / 4 * 3 + 2);
    for c in b.chunks(4) {
        let mut n = 0u32;
        for (i, &ch) in c.iter().enumerate() {
            let v = sextet(ch).ok_or_else(|| {
                Error::msg(
                    Status::ProtocolError,
                    format!("a value from the launcher has a byte {ch:#04x} that is not base64"),
                )
            })?;
            n |= v << (18 - 6 * i);
        }
        let bytes = c.len() - 1;
        // A short last group carries bits past its bytes; `encode` leaves them zero, and
        // text with any set is not what it wrote (two texts would decode the same).
        if n & ((1u32 << (24 - 8 * bytes)) - 1) != 0 {
            return Err(Error::msg(
                Status::ProtocolError,
                format!(
                    "a value from the launcher is not base64 as Courier writes it: {text:.40?} ends in stray bits"
                ),
            ));
        }
        for i in 0..bytes {
            out.push((n >> (16 - 8 * i)) as u8);
        }
    }
    Ok(out)
}

/// The store key for `rank`'s `key`, and its `i`th chunk's.
pub fn store_key(rank: u32, key: &str, chunk: usize) -> String {
    if chunk == 0 {
        format!("c{rank}.{key}")
    } else {
        format!("c{rank}.{key}#{chunk}")
    }
}

/// A user key usable in a text store whose keys are at most `key_max` bytes (the rank prefix
/// and a chunk suffix included): printable, no space, `;`, `=` or `#`.
pub fn check_key(key: &str, key_max: usize) -> Result<()> {
    if key.is_empty() {
        return Err(Error::new(
            Status::InvalidParam,
            "a job key must not be empty",
        ));
    }
    if let Some(c) = key
        .bytes()
        .find(|&c| !c.is_ascii_graphic() || matches!(c, b';' | b'=' | b'#'))
    {
        return Err(Error::msg(
            Status::InvalidParam,
            format!(
                "job key {key:?} has a byte {c:#04x}: keys are printable ASCII without ';', '=', '#' or spaces"
            ),
        ));
    }
    // "c" + rank (10 digits) + "." + key + "#" + chunk (4 digits).
    let room = key_max.saturating_sub(16);
    if key.len() > room {
        return Err(Error::msg(
            Status::InvalidParam,
            format!(
                "job key {key:?} is {} bytes; this launcher's store takes keys of at most {room}",
                key.len()
            ),
        ));
    }
    Ok(())
}

/// `value` as chunks of at most `val_max` characters: the first prefixed with the count.
pub fn split(value: &[u8], val_max: usize) -> Result<Vec<String>> {
    let text = encode(value);
    // The first chunk carries "NNNN:" in front.
    let per = val_max.saturating_sub(8).max(16);
    let count = text.len().div_ceil(per).max(1);
    if count > MAX_CHUNKS {
        return Err(Error::msg(
            Status::InvalidParam,
            format!(
                "a job value of {} bytes is too large for this launcher's store ({} chunks of {per} characters, at most {MAX_CHUNKS})",
                value.len(),
                count
            ),
        ));
    }
    let mut out = Vec::with_capacity(count);
    for i in 0..count {
        let part = &text[(i * per).min(text.len())..((i + 1) * per).min(text.len())];
        if i == 0 {
            out.push(format!("{count}:{part}"));
        } else {
            out.push(part.to_string());
        }
    }
    Ok(out)
}

/// The chunk count and first part of a stored first chunk.
pub fn head(first: &str) -> Result<(usize, &str)> {
    let bad = || {
        Error::msg(
            Status::ProtocolError,
            format!(
                "a job value from the launcher does not start with a chunk count: {:?}",
                first.chars().take(40).collect::<String>()
            ),
        )
    };
    let (n, rest) = first.split_once(':').ok_or_else(bad)?;
    let n: usize = n.parse().map_err(|_| bad())?;
    if n == 0 || n > MAX_CHUNKS {
        return Err(bad());
    }
    Ok((n, rest))
}

/// Longest PMI command line either side takes.
pub const MAX_LINE: usize = 64 * 1024;

/// The `key=value` pairs of one PMI command, separated by `sep` (' ' for PMI-1, ';' for
/// PMI-2). A value ends at the next separator; a pair without '=' is an error.
pub fn pairs(line: &str, sep: char) -> Result<Vec<(&str, &str)>> {
    let mut out = Vec::new();
    for part in line.trim_end_matches(['\n', '\r']).split(sep) {
        if part.is_empty() {
            continue;
        }
        let (k, v) = part.split_once('=').ok_or_else(|| {
            Error::msg(
                Status::ProtocolError,
                format!(
                    "PMI: {:?} in {:?} is not key=value",
                    part.chars().take(40).collect::<String>(),
                    line.chars().take(80).collect::<String>()
                ),
            )
        })?;
        if k.is_empty() {
            return Err(Error::msg(
                Status::ProtocolError,
                format!(
                    "PMI: an empty key in {:?}",
                    line.chars().take(80).collect::<String>()
                ),
            ));
        }
        out.push((k, v));
    }
    Ok(out)
}

/// The value of `key` among `pairs` (the first one).
pub fn field<'a>(pairs: &[(&'a str, &'a str)], key: &str) -> Option<&'a str> {
    pairs.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
}

/// Which node each rank is on, from a PMI process mapping such as `(vector,(0,2,2))`: blocks
/// of (first node, node count, ranks per node), taken in turn until `size` ranks are placed.
pub fn process_mapping(text: &str, size: u32) -> Result<Vec<u32>> {
    let bad = || {
        Error::msg(
            Status::ProtocolError,
            format!(
                "PMI_process_mapping {:?} is not (vector,(node,count,ppn),...)",
                text.chars().take(80).collect::<String>()
            ),
        )
    };
    if size > super::MAX_RANKS {
        return Err(Error::msg(
            Status::ProtocolError,
            format!(
                "a job of {size} ranks: Courier takes at most {}",
                super::MAX_RANKS
            ),
        ));
    }
    let t = text.trim();
    let inner = t
        .strip_prefix('(')
        .and_then(|t| t.strip_suffix(')'))
        .ok_or_else(bad)?;
    let rest = inner.strip_prefix("vector").ok_or_else(bad)?;
    let mut blocks = Vec::new();
    for part in rest.split("),").map(|p| p.trim_start_matches(',')) {
        let p = part.trim().trim_start_matches('(').trim_end_matches(')');
        if p.is_empty() {
            continue;
        }
        let nums: Vec<u32> = p
            .split(',')
            .map(|n| n.trim().parse::<u32>())
            .collect::<std::result::Result<_, _>>()
            .map_err(|_| bad())?;
        if nums.len() != 3 || nums[1] == 0 || nums[2] == 0 || nums[1] > 1 << 20 || nums[2] > 1 << 20
        {
            return Err(bad());
        }
        blocks.push((nums[0], nums[1], nums[2]));
    }
    if blocks.is_empty() {
        return Err(bad());
    }
    let mut nodes = Vec::with_capacity(size as usize);
    'fill: loop {
        for &(first, count, ppn) in &blocks {
            for n in first..first.saturating_add(count) {
                for _ in 0..ppn {
                    if nodes.len() == size as usize {
                        break 'fill;
                    }
                    nodes.push(n);
                }
            }
        }
    }
    Ok(nodes)
}

/// This rank's (host, local rank, local size) from each rank's node.
pub fn locality(nodes: &[u32], rank: u32) -> (u32, u32, u32) {
    let host = nodes.get(rank as usize).copied().unwrap_or(0);
    let local_rank = nodes[..(rank as usize).min(nodes.len())]
        .iter()
        .filter(|&&n| n == host)
        .count() as u32;
    let local_size = nodes.iter().filter(|&&n| n == host).count().max(1) as u32;
    (host, local_rank, local_size)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trips_every_length() {
        for len in 0..70 {
            let data: Vec<u8> = (0..len).map(|i| (i * 37 + 11) as u8).collect();
            let t = encode(&data);
            assert!(
                t.bytes()
                    .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
            );
            assert_eq!(decode(&t).unwrap(), data, "length {len}");
        }
        assert!(decode("abc=").is_err());
        assert!(decode("a").is_err());
        // Only the text encode writes: no bits set past a short last group's bytes.
        assert_eq!(decode("cg").unwrap(), b"r");
        assert!(decode("cm").is_err(), "stray bits after one byte");
        assert_eq!(decode("cnM").unwrap(), b"rs");
        assert!(decode("cnN").is_err(), "stray bits after two bytes");
    }

    #[test]
    fn values_split_and_join() {
        let data: Vec<u8> = (0..5000u32).map(|i| (i * 7) as u8).collect();
        let parts = split(&data, 256).unwrap();
        assert!(parts.len() > 1);
        assert!(parts.iter().all(|p| p.len() <= 256));
        let (n, first) = head(&parts[0]).unwrap();
        assert_eq!(n, parts.len());
        let mut text = first.to_string();
        for p in &parts[1..] {
            text.push_str(p);
        }
        assert_eq!(decode(&text).unwrap(), data);
        assert_eq!(head(&split(b"", 64).unwrap()[0]).unwrap(), (1, ""));
        assert!(head("x:abc").is_err());
        assert!(head("0:abc").is_err());
        assert!(head("99999999:abc").is_err());
    }

    #[test]
    fn keys_are_checked() {
        assert!(check_key("addr", 64).is_ok());
        assert!(check_key("", 64).is_err());
        assert!(check_key("a b", 64).is_err());
        assert!(check_key("a=b", 64).is_err());
        assert!(check_key(&"k".repeat(60), 64).is_err());
        assert_eq!(store_key(3, "addr", 0), "c3.addr");
        assert_eq!(store_key(3, "addr", 2), "c3.addr#2");
    }

    #[test]
    fn pmi_lines_and_mappings_parse() {
        let p = pairs("cmd=get_result rc=0 value=abc\n", ' ').unwrap();
        assert_eq!(field(&p, "cmd"), Some("get_result"));
        assert_eq!(field(&p, "value"), Some("abc"));
        assert!(pairs("cmd=x junk", ' ').is_err());
        let p = pairs("cmd=kvs-get-response;rc=0;found=TRUE;value=x;", ';').unwrap();
        assert_eq!(field(&p, "found"), Some("TRUE"));
        assert_eq!(
            process_mapping("(vector,(0,2,2))", 4).unwrap(),
            vec![0, 0, 1, 1]
        );
        assert_eq!(
            process_mapping("(vector,(0,1,3))", 3).unwrap(),
            vec![0, 0, 0]
        );
        // Cyclic: one rank per node, repeated.
        assert_eq!(
            process_mapping("(vector,(0,2,1))", 4).unwrap(),
            vec![0, 1, 0, 1]
        );
        assert_eq!(
            process_mapping("(vector,(0,1,2),(1,1,1))", 3).unwrap(),
            vec![0, 0, 1]
        );
        assert!(process_mapping("(vector)", 2).is_err());
        assert!(process_mapping("(vector,(0,0,1))", 2).is_err());
        assert!(process_mapping("junk", 2).is_err());
        // A size past MAX_RANKS is refused before anything is sized by it.
        let e = process_mapping("(vector,(0,1,1))", u32::MAX).unwrap_err();
        assert!(e.to_string().contains("at most"), "{e}");
        assert!(process_mapping("(vector,(0,1,1))", super::super::MAX_RANKS + 1).is_err());
        assert_eq!(locality(&[0, 0, 1, 1], 3), (1, 1, 2));
        assert_eq!(locality(&[0, 1, 0, 1], 2), (0, 1, 2));
    }
}
