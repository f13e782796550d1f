//! String buffers on the wire (protocol version 2): a buffer's elements as the
//! protobuf encoding of `StringElements` (`proto/remote.proto`), which the
//! chunks of a transfer cut anywhere, and the streaming decoder both ends read
//! them with.
//!
//! The decoder takes only what protobuf encoders write for that message, so a
//! buffer reads back as the very bytes it was uploaded with: every element is
//! field 1 (key `0x0a`), its length a varint of the fewest bytes, then UTF-8.
//! Memory grows with the bytes that really arrive (never with a length or a
//! count announced by the peer), and the whole encoding, plus what each
//! element costs in memory beyond its text ([`ELEMENT_COST`]: many empty
//! strings are small on the wire but not in memory), is bounded by
//! [`MAX_STRING_BUFFER_BYTES`].

use prost::encoding::{encode_varint, encoded_len_varint};

use crate::error::{Error, Result};

/// The first protocol version with string buffers.
pub const STRINGS_VERSION: u32 = 2;

/// Most bytes one string buffer takes on the wire (its `StringElements`).
pub const MAX_STRING_BUFFER_BYTES: usize = 1 << 30;

/// The key of `StringElements.elements`: field 1, length-delimited.
const ELEMENT_KEY: u8 = 0x0a;

/// What each element is charged against [`MAX_STRING_BUFFER_BYTES`] beyond
/// its bytes on the wire: its place in the decoded elements.
const ELEMENT_COST: usize = std::mem::size_of::<Box<str>>();

/// Bytes of `strings` on the wire (saturating: anything near `usize::MAX` is
/// over the limit anyway).
fn encoded_len<S: AsRef<str>>(strings: &[S]) -> usize {
    strings.iter().fold(0usize, |total, s| {
        let len = s.as_ref().len();
        total.saturating_add(1 + encoded_len_varint(len as u64) + len)
    })
}

/// `strings` (row-major elements) on the wire; `resource_exhausted` when that
/// takes over [`MAX_STRING_BUFFER_BYTES`].
pub(crate) fn encode_strings<S: AsRef<str>>(strings: &[S]) -> Result<Vec<u8>> {
    let len = encoded_len(strings);
    let cost = len.saturating_add(strings.len().saturating_mul(ELEMENT_COST));
    if cost > MAX_STRING_BUFFER_BYTES {
        return Err(Error::resource_exhausted(format!(
            "{} strings take {len} bytes on the wire ({cost} with {ELEMENT_COST} per element), \
             over the limit of {MAX_STRING_BUFFER_BYTES}",
            strings.len()
        )));
    }
    let mut out = Vec::new();
    out.try_reserve_exact(len)
        .map_err(|_| Error::resource_exhausted(format!("cannot allocate {len} bytes")))?;
    for s in strings {
        let s = s.as_ref();
        out.push(ELEMENT_KEY);
        encode_varint(s.len() as u64, &mut out);
        out.extend_from_slice(s.as_bytes());
    }
    Ok(out)
}

/// The error of an encoding that is not what an encoder writes.
fn malformed(what: &str) -> Error {
    Error::invalid_argument(format!("malformed string elements: {what}"))
}

fn no_memory() -> Error {
    Error::resource_exhausted("cannot allocate memory for received strings")
}

/// Where the decoder is in the encoding.
enum Part {
    /// Before an element's key.
    Key,
    /// Inside an element's length: the value so far and its bytes so far.
    Length { value: u64, bytes: u32 },
    /// Inside an element's UTF-8: the bytes so far, and how many are to come.
    Text { text: Vec<u8>, left: usize },
}

/// Decodes a string buffer of `count` elements as its bytes arrive, in pieces
/// cut anywhere: `invalid_argument` for anything but `count` elements encoded
/// as an encoder writes them, `resource_exhausted` past
/// [`MAX_STRING_BUFFER_BYTES`] or when memory runs out.
pub(crate) struct StringDecoder {
    count: usize,
    elements: Vec<Box<str>>,
    /// Bytes taken so far (at most `MAX_STRING_BUFFER_BYTES`).
    taken: usize,
    part: Part,
}

impl StringDecoder {
    /// A decoder of `count` elements (nothing is allocated for them yet).
    pub(crate) fn new(count: usize) -> StringDecoder {
        StringDecoder {
            count,
            elements: Vec::new(),
            taken: 0,
            part: Part::Key,
        }
    }

    /// Takes the next bytes of the encoding.
    pub(crate) fn push(&mut self, mut bytes: &[u8]) -> Result<()> {
        if bytes.len() > MAX_STRING_BUFFER_BYTES - self.taken {
            return Err(Error::resource_exhausted(format!(
                "string elements over the limit of {MAX_STRING_BUFFER_BYTES} bytes"
            )));
        }
        // Where `bytes` ends in the encoding: whatever an element's length
        // says, its text must end there or later within the limit.
        self.taken += bytes.len();
        while let Some((&byte, rest)) = bytes.split_first() {
            match &mut self.part {
                Part::Key => {
                    if self.elements.len() == self.count {
                        return Err(malformed(&format!(
                            "more than the {} elements of the buffer",
                            self.count
                        )));
                    }
                    if byte != ELEMENT_KEY {
                        return Err(malformed(&format!(
                            "byte {byte:#04x} where the key of element {} (0x0a) belongs",
                            self.elements.len()
                        )));
                    }
                    self.part = Part::Length { value: 0, bytes: 0 };
                    bytes = rest;
                }
                Part::Length { value, bytes: n } => {
                    // A tenth byte may only hold bit 63.
                    if *n == 9 && byte > 1 {
                        return Err(malformed("an element's length overflows 64 bits"));
                    }
                    *value |= u64::from(byte & 0x7f) << (7 * *n);
                    *n += 1;
                    bytes = rest;
                    if byte & 0x80 != 0 {
                        continue;
                    }
                    if byte == 0 && *n > 1 {
                        return Err(malformed("an element's length is longer than it needs"));
                    }
                    // Checked before anything is allocated for the element.
                    let room = (MAX_STRING_BUFFER_BYTES - (self.taken - bytes.len()))
                        .saturating_sub(ELEMENT_COST);
                    let len = usize::try_from(*value)
                        .ok()
                        .filter(|len| *len <= room)
                        .ok_or_else(|| {
                            Error::resource_exhausted(format!(
                                "an element of {value} bytes takes string elements over the \
                                 limit of {MAX_STRING_BUFFER_BYTES} bytes"
                            ))
                        })?;
                    self.part = Part::Text {
                        text: Vec::new(),
                        left: len,
                    };
                    if len == 0 {
                        self.end_element()?;
                    }
                }
                Part::Text { text, left } => {
                    let n = (*left).min(bytes.len());
                    // Grows with what arrived, not with what was announced.
                    text.try_reserve(n).map_err(|_| no_memory())?;
                    text.extend_from_slice(&bytes[..n]);
                    *left -= n;
                    bytes = &bytes[n..];
                    if *left == 0 {
                        self.end_element()?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Keeps the element whose text is complete.
    fn end_element(&mut self) -> Result<()> {
        let Part::Text { text, .. } = std::mem::replace(&mut self.part, Part::Key) else {
            return Err(Error::internal("an element ended outside its text"));
        };
        let index = self.elements.len();
        if ELEMENT_COST > MAX_STRING_BUFFER_BYTES - self.taken {
            return Err(Error::resource_exhausted(format!(
                "{} string elements take over the limit of {MAX_STRING_BUFFER_BYTES} bytes",
                index + 1
            )));
        }
        self.taken += ELEMENT_COST;
        let text = String::from_utf8(text)
            .map_err(|e| malformed(&format!("element {index} is not UTF-8 ({e})")))?;
        self.elements.try_reserve(1).map_err(|_| no_memory())?;
        self.elements.push(text.into_boxed_str());
        Ok(())
    }

    /// The encoding ended: its elements, if it held exactly `count` whole ones.
    pub(crate) fn finish(self) -> Result<Box<[Box<str>]>> {
        if !matches!(self.part, Part::Key) {
            return Err(malformed("the bytes end inside an element"));
        }
        if self.elements.len() != self.count {
            return Err(malformed(&format!(
                "{} elements where the buffer holds {}",
                self.elements.len(),
                self.count
            )));
        }
        Ok(self.elements.into_boxed_slice())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorCode;
    use crate::transport::proto::StringElements;
    use prost::Message;

    const SAMPLE: [&str; 6] = ["", "a", "héllo", "naïve 🙂", "", "tail"];

    /// `wire` decoded for `count` elements in pieces of `piece` bytes.
    fn decode(wire: &[u8], count: usize, piece: usize) -> Result<Vec<String>> {
        let mut decoder = StringDecoder::new(count);
        for part in wire.chunks(piece.max(1)) {
            decoder.push(part)?;
        }
        if wire.is_empty() {
            decoder.push(&[])?;
        }
        Ok(decoder.finish()?.iter().map(|s| s.to_string()).collect())
    }

    #[test]
    fn the_encoding_is_what_protobuf_encodes_for_string_elements() {
        let long = "x".repeat(300);
        let mut strings: Vec<&str> = SAMPLE.to_vec();
        strings.push(&long);
        let wire = encode_strings(&strings).unwrap();
        let message = StringElements {
            elements: strings.iter().map(|s| s.to_string()).collect(),
        };
        assert_eq!(wire, message.encode_to_vec());
        assert_eq!(wire.len(), encoded_len(&strings));
        assert_eq!(
            StringElements::decode(&wire[..]).unwrap().elements,
            message.elements
        );
        assert!(encode_strings::<&str>(&[]).unwrap().is_empty());
    }

    #[test]
    fn elements_decode_from_pieces_cut_anywhere() {
        let long = "é".repeat(200);
        let mut strings: Vec<&str> = SAMPLE.to_vec();
        strings.push(&long);
        let wire = encode_strings(&strings).unwrap();
        for piece in [1, 2, 3, 5, 64, wire.len()] {
            assert_eq!(
                decode(&wire, strings.len(), piece).unwrap(),
                strings,
                "pieces of {piece}"
            );
        }
        assert!(decode(&[], 0, 1).unwrap().is_empty());
        assert_eq!(decode(&[0x0a, 0x00], 1, 1).unwrap(), [""]);
    }

    #[test]
    fn anything_an_encoder_would_not_write_is_refused() {
        let good = encode_strings(&SAMPLE).unwrap();
        let n = SAMPLE.len();
        let invalid = ErrorCode::InvalidArgument;
        let exhausted = ErrorCode::ResourceExhausted;
        let mut overlong_ten = vec![0x0a];
        overlong_ten.extend_from_slice(&[0xff; 9]);
        overlong_ten.push(0x02);
        let cases: Vec<(&str, Vec<u8>, usize, ErrorCode, &str)> = vec![
            (
                "too few elements",
                good.clone(),
                n + 1,
                invalid,
                "elements where",
            ),
            (
                "too many elements",
                good.clone(),
                n - 1,
                invalid,
                "more than",
            ),
            ("none for one", vec![], 1, invalid, "0 elements where"),
            (
                "cut in a key",
                good[..good.len() - 5].to_vec(),
                n,
                invalid,
                "inside",
            ),
            ("cut in a length", vec![0x0a, 0x80], 1, invalid, "inside"),
            (
                "cut in the text",
                vec![0x0a, 0x03, b'a'],
                1,
                invalid,
                "inside",
            ),
            ("another field", vec![0x12, 0x00], 1, invalid, "key"),
            ("a varint field", vec![0x08, 0x00], 1, invalid, "key"),
            (
                "a padded length",
                vec![0x0a, 0x81, 0x00, b'a'],
                1,
                invalid,
                "longer",
            ),
            (
                "a zero length padded",
                vec![0x0a, 0x80, 0x00],
                1,
                invalid,
                "longer",
            ),
            (
                "an overflowing length",
                overlong_ten,
                1,
                invalid,
                "overflows",
            ),
            (
                "not UTF-8",
                vec![0x0a, 0x02, 0xc3, 0x28],
                1,
                invalid,
                "UTF-8",
            ),
            (
                "a cut character",
                vec![0x0a, 0x01, 0xc3],
                1,
                invalid,
                "UTF-8",
            ),
            (
                "a length past the limit",
                {
                    let mut wire = vec![0x0a];
                    encode_varint(MAX_STRING_BUFFER_BYTES as u64, &mut wire);
                    wire
                },
                1,
                exhausted,
                "limit",
            ),
            (
                "a huge length",
                {
                    let mut wire = vec![0x0a];
                    encode_varint(u64::MAX, &mut wire);
                    wire
                },
                1,
                exhausted,
                "limit",
            ),
        ];
        for (what, wire, count, code, text) in cases {
            for piece in [1, 2, wire.len()] {
                let err = decode(&wire, count, piece)
                    .err()
                    .unwrap_or_else(|| panic!("{what} decoded"));
                assert_eq!(err.code(), code, "{what} in pieces of {piece}: {err}");
                assert!(err.message().contains(text), "{what}: {err}");
            }
        }
    }

    #[test]
    fn the_limit_bounds_the_whole_encoding() {
        // Just under: the element fits; one byte more does not.
        let header = 1 + encoded_len_varint(MAX_STRING_BUFFER_BYTES as u64);
        let fits = MAX_STRING_BUFFER_BYTES - header - ELEMENT_COST;
        let mut wire = vec![0x0a];
        encode_varint(fits as u64, &mut wire);
        let mut decoder = StringDecoder::new(2);
        decoder.push(&wire).unwrap();
        let mut wire = vec![0x0a];
        encode_varint(fits as u64 + 1, &mut wire);
        let mut decoder = StringDecoder::new(1);
        let err = decoder.push(&wire).unwrap_err();
        assert_eq!(err.code(), ErrorCode::ResourceExhausted, "{err}");
        // Bytes past the limit are refused before they are looked at.
        let mut decoder = StringDecoder::new(1);
        decoder.taken = MAX_STRING_BUFFER_BYTES - 1;
        let err = decoder.push(&[0x0a, 0x00]).unwrap_err();
        assert_eq!(err.code(), ErrorCode::ResourceExhausted, "{err}");
        // Empty elements are charged their place in memory: 2 wire bytes each
        // would otherwise let 1 GiB of them take 8 GiB.
        let mut decoder = StringDecoder::new(usize::MAX);
        decoder.taken = MAX_STRING_BUFFER_BYTES - 2 - ELEMENT_COST;
        decoder.push(&[0x0a, 0x00]).unwrap();
        let err = decoder.push(&[0x0a, 0x00]).unwrap_err();
        assert_eq!(err.code(), ErrorCode::ResourceExhausted, "{err}");
    }
}
