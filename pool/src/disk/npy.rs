//! The `.npy` header of a slot file (format 1.0): what makes `numpy.load(path, mmap_mode="r")`
//! open a cached chunk as the array it is.
//!
//! Our header is always [`HEADER_LEN`] bytes (the dictionary padded with spaces), so the data
//! starts on a page boundary: the mapping is page-aligned for every dtype, and an O_DIRECT write
//! of header and data is one aligned write.

/// Bytes before the data: one page.
pub const HEADER_LEN: usize = 4096;

const MAGIC: &[u8] = b"\x93NUMPY";

/// The header for a C-order array of `shape` and numpy type string `descr`.
pub fn header(descr: &str, shape: &[u64]) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(u64::to_string).collect();
    let shape = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    let dict = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    let mut out = Vec::with_capacity(HEADER_LEN);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[1, 0]);
    let dict_len = HEADER_LEN - out.len() - 2;
    out.extend_from_slice(&(dict_len as u16).to_le_bytes());
    out.extend_from_slice(dict.as_bytes());
    out.resize(HEADER_LEN - 1, b' ');
    out.push(b'\n');
    out
}

/// What a header says.
#[derive(Debug, PartialEq, Eq)]
pub struct Parsed {
    /// Numpy type string.
    pub descr: String,
    /// Shape.
    pub shape: Vec<u64>,
    /// Where the data starts.
    pub data_offset: usize,
}

/// Parses a format 1.0/2.0 header; `None` when it is not one or describes a Fortran-order
/// array (which our files never are).
pub fn parse(bytes: &[u8]) -> Option<Parsed> {
    if bytes.len() < 10 || &bytes[..6] != MAGIC {
        return None;
    }
    let (len, start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 => (
            u32::from_le_bytes(bytes.get(8..12)?.try_into().ok()?) as usize,
            12,
        ),
        _ => return None,
    };
    let dict = std::str::from_utf8(bytes.get(start..start + len)?).ok()?;
    let descr = value_after(dict, "'descr':")?
        .strip_prefix('\'')?
        .split('\'')
        .next()?
        .to_string();
    if !value_after(dict, "'fortran_order':")?.starts_with("False") {
        return None;
    }
    let shape_text = value_after(dict, "'shape':")?.strip_prefix('(')?;
    let shape_text = &shape_text[..shape_text.find(')')?];
    let shape = shape_text
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().ok())
        .collect::<Option<Vec<u64>>>()?;
    Some(Parsed {
        descr,
        shape,
        data_offset: start + len,
    })
}

fn value_after<'a>(dict: &'a str, key: &str) -> Option<&'a str> {
    Some(dict[dict.find(key)? + key.len()..].trim_start())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_and_pads_to_a_page() {
        for shape in [vec![4u64, 121, 240], vec![7], vec![]] {
            let h = header("<f4", &shape);
            assert_eq!(h.len(), HEADER_LEN);
            assert_eq!(*h.last().unwrap(), b'\n');
            let p = parse(&h).unwrap();
            assert_eq!(p.descr, "<f4");
            assert_eq!(p.shape, shape);
            assert_eq!(p.data_offset, HEADER_LEN);
        }
        assert!(parse(b"\x93NUMPY\x01\x00").is_none(), "truncated");
        assert!(parse(&[0u8; 64]).is_none(), "no magic");
        let mut fortran = header("<f4", &[2, 3]);
        let at = fortran.windows(5).position(|w| w == b"False").unwrap();
        fortran[at..at + 5].copy_from_slice(b"True ");
        assert!(parse(&fortran).is_none(), "Fortran order is refused");
    }
}
