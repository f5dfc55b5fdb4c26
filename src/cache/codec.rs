//! The byte format of what tp caches: little-endian integers, LEB128
//! varints, length-prefixed strings and lists. [`Reader`] reads it as
//! untrusted input: every read is bounded by the bytes left, a count is
//! checked against the bytes its items need at least before anything is
//! allocated for it, and nothing panics on any input.

/// Why bytes did not decode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bad(pub &'static str);

impl std::fmt::Display for Bad {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for Bad {}

/// The result of a read.
pub type Result<T> = std::result::Result<T, Bad>;

/// Bytes being written.
#[derive(Debug, Default, Clone)]
pub struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    /// An empty writer.
    pub fn new() -> Writer {
        Writer::default()
    }

    /// What was written.
    pub fn into_bytes(self) -> Vec<u8> {
        self.buf
    }

    /// What was written so far.
    pub fn bytes(&self) -> &[u8] {
        &self.buf
    }

    /// Number of bytes written.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// True if nothing was written.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// One byte.
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.buf.push(v);
        self
    }

    /// A boolean, as one byte 0 or 1.
    pub fn bool(&mut self, v: bool) -> &mut Self {
        self.u8(v as u8)
    }

    /// A little-endian u32.
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// A little-endian u64.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// An unsigned LEB128 varint.
    pub fn var(&mut self, mut v: u64) -> &mut Self {
        loop {
            let byte = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                self.buf.push(byte);
                return self;
            }
            self.buf.push(byte | 0x80);
        }
    }

    /// Raw bytes, as they are.
    pub fn raw(&mut self, b: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(b);
        self
    }

    /// Bytes with their length first.
    pub fn blob(&mut self, b: &[u8]) -> &mut Self {
        self.var(b.len() as u64).raw(b)
    }

    /// Numbers in their own order, their count first, each a varint.
    pub fn list(&mut self, values: &[u64]) -> &mut Self {
        self.var(values.len() as u64);
        for &v in values {
            self.var(v);
        }
        self
    }

    /// A string with its length first.
    pub fn str(&mut self, s: &str) -> &mut Self {
        self.blob(s.as_bytes())
    }

    /// An optional string: a byte 0, or 1 and the string.
    pub fn opt_str(&mut self, s: Option<&str>) -> &mut Self {
        match s {
            Some(s) => self.u8(1).str(s),
            None => self.u8(0),
        }
    }
}

/// Bytes being read, none of them trusted.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    /// A reader of `data` from its start.
    pub fn new(data: &'a [u8]) -> Reader<'a> {
        Reader { data, at: 0 }
    }

    /// Bytes not read yet.
    pub fn left(&self) -> usize {
        self.data.len() - self.at
    }

    /// True when every byte was read.
    pub fn done(&self) -> bool {
        self.left() == 0
    }

    /// Fails unless every byte was read.
    pub fn finish(&self) -> Result<()> {
        if self.done() { Ok(()) } else { Err(Bad("bytes left over at the end")) }
    }

    /// The next `n` bytes.
    pub fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if n > self.left() {
            return Err(Bad("shorter than its contents say"));
        }
        let out = &self.data[self.at..self.at + n];
        self.at += n;
        Ok(out)
    }

    /// One byte.
    pub fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }

    /// A boolean: 0 or 1, nothing else.
    pub fn bool(&mut self) -> Result<bool> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(Bad("a flag that is neither 0 nor 1")),
        }
    }

    /// A little-endian u32.
    pub fn u32(&mut self) -> Result<u32> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// A little-endian u64.
    pub fn u64(&mut self) -> Result<u64> {
        let b = self.take(8)?;
        let mut w = [0u8; 8];
        w.copy_from_slice(b);
        Ok(u64::from_le_bytes(w))
    }

    /// An unsigned LEB128 varint of at most 64 bits.
    #[inline]
    pub fn var(&mut self) -> Result<u64> {
        let rest = &self.data[self.at..];
        let mut v = 0u64;
        for (k, &byte) in rest.iter().enumerate().take(10) {
            let bits = u64::from(byte & 0x7f);
            if k == 9 && bits > 1 {
                return Err(Bad("a number of more than 64 bits"));
            }
            v |= bits << (7 * k);
            if byte & 0x80 == 0 {
                self.at += k + 1;
                return Ok(v);
            }
        }
        Err(if rest.len() < 10 { Bad("shorter than its contents say") } else { Bad("a number of more than 64 bits") })
    }

    /// A varint that fits a u32.
    pub fn var32(&mut self) -> Result<u32> {
        u32::try_from(self.var()?).map_err(|_| Bad("a number out of range"))
    }

    /// A count of items each at least `min_size` bytes long (at least 1):
    /// never more than the bytes left could hold, so a count read from
    /// damaged bytes cannot make the caller allocate more than the input.
    pub fn count(&mut self, min_size: usize) -> Result<usize> {
        let n = self.var()?;
        let n = usize::try_from(n).map_err(|_| Bad("a count out of range"))?;
        if n.checked_mul(min_size.max(1)).is_none_or(|need| need > self.left()) {
            return Err(Bad("a count larger than the bytes that follow"));
        }
        Ok(n)
    }

    /// Numbers written by [`Writer::list`].
    pub fn list(&mut self) -> Result<Vec<u64>> {
        let n = self.count(1)?;
        (0..n).map(|_| self.var()).collect()
    }

    /// Bytes with their length first.
    pub fn blob(&mut self) -> Result<&'a [u8]> {
        let n = self.count(1)?;
        self.take(n)
    }

    /// A UTF-8 string with its length first.
    pub fn str(&mut self) -> Result<&'a str> {
        std::str::from_utf8(self.blob()?).map_err(|_| Bad("a string that is not UTF-8"))
    }

    /// A string, owned.
    pub fn string(&mut self) -> Result<String> {
        self.str().map(str::to_string)
    }

    /// An optional string ([`Writer::opt_str`]).
    pub fn opt_string(&mut self) -> Result<Option<String>> {
        Ok(if self.bool()? { Some(self.string()?) } else { None })
    }
}

/// A 64-bit hash of `data`, for cache keys and to notice damaged files: a
/// multiply-xorshift over 8-byte words with a final avalanche. Not made to
/// resist someone who chooses the bytes; the cache's directory is what
/// keeps others out.
pub fn hash64(data: &[u8]) -> u64 {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut h = 0x243f_6a88_85a3_08d3u64 ^ (data.len() as u64).wrapping_mul(K);
    let mut words = data.chunks_exact(8);
    for w in &mut words {
        let mut b = [0u8; 8];
        b.copy_from_slice(w);
        h = (h ^ u64::from_le_bytes(b)).wrapping_mul(K);
        h ^= h >> 32;
    }
    let mut tail = [0u8; 8];
    tail[..words.remainder().len()].copy_from_slice(words.remainder());
    h = (h ^ u64::from_le_bytes(tail) ^ 0xff).wrapping_mul(K);
    // fmix64 of MurmurHash3.
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_read_back_as_written() {
        let mut w = Writer::new();
        w.u8(7).bool(true).u32(0xdead_beef).u64(u64::MAX).var(0).var(300).var(u64::MAX);
        w.str("malloc").opt_str(None).opt_str(Some("é")).blob(&[1, 2, 3]);
        let bytes = w.into_bytes();
        let mut r = Reader::new(&bytes);
        assert_eq!(r.u8().unwrap(), 7);
        assert!(r.bool().unwrap());
        assert_eq!(r.u32().unwrap(), 0xdead_beef);
        assert_eq!(r.u64().unwrap(), u64::MAX);
        assert_eq!((r.var().unwrap(), r.var().unwrap(), r.var().unwrap()), (0, 300, u64::MAX));
        assert_eq!(r.str().unwrap(), "malloc");
        assert_eq!(r.opt_string().unwrap(), None);
        assert_eq!(r.opt_string().unwrap().as_deref(), Some("é"));
        assert_eq!(r.blob().unwrap(), &[1, 2, 3]);
        assert!(r.finish().is_ok());
    }

    #[test]
    fn damaged_bytes_are_errors_not_panics() {
        // A varint that never ends, one of 70 bits, a count far beyond the
        // input, a string that is not UTF-8, a flag of 2, a short read.
        assert!(Reader::new(&[0xff; 3]).var().is_err());
        assert!(Reader::new(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f]).var().is_err());
        assert!(Reader::new(&[0xff, 0xff, 0xff, 0xff, 0x0f, 1, 2]).count(1).is_err());
        assert!(Reader::new(&[3, 1, 2, 3]).count(2).is_err(), "3 items of 2 bytes need 6");
        assert!(Reader::new(&[2, 0xc3, 0x28]).str().is_err());
        assert!(Reader::new(&[2]).bool().is_err());
        assert!(Reader::new(&[1, 2, 3]).u32().is_err());
        assert!(Reader::new(&[1]).finish().is_err());
        // Every prefix of valid bytes fails cleanly.
        let mut w = Writer::new();
        w.str("a string").var(1 << 40).u64(5);
        let bytes = w.into_bytes();
        for n in 0..bytes.len() {
            let mut r = Reader::new(&bytes[..n]);
            assert!(r.str().and_then(|_| r.var()).and_then(|_| r.u64()).is_err(), "prefix {n}");
        }
    }

    #[test]
    fn the_hash_tells_close_inputs_apart() {
        let a = hash64(b"tp cache key 1");
        assert_eq!(a, hash64(b"tp cache key 1"));
        assert_ne!(a, hash64(b"tp cache key 2"));
        assert_ne!(hash64(b""), hash64(b"\0"));
        assert_ne!(hash64(&[0; 8]), hash64(&[0; 9]));
        let mut flipped = vec![0u8; 1000];
        let base = hash64(&flipped);
        flipped[999] = 1;
        assert_ne!(base, hash64(&flipped));
    }
}
