//! Prompts bounded by the context they are for: a prompt from a file,
//! standard input or a request is read only as far as the context could
//! hold it, and tokenized only until it is known not to fit, so that a
//! hostile or mistaken input of any size costs memory and time in
//! proportion to the context, not to itself.
//!
//! Two bounds, applied in turn:
//! 1. **Bytes.** A token covers at most as many bytes of text as its own
//!    text has; text averages 3 to 5 bytes per token. A prompt of more than
//!    [`byte_limit`] bytes (64 per position, and 4 KiB) is refused unread
//!    past that ([`read_at_most`]).
//! 2. **Tokens.** A prompt within the byte limit is tokenized with
//!    [`crate::tokenizer::Tokenizer::encode_at_most`] (or
//!    [`crate::chat::ChatTemplate::encode_rendered_at_most`]), which stops
//!    at the first word or piece of text past the context instead of
//!    tokenizing the rest.

use std::io::Read;

/// Bytes of prompt per context position beyond which a prompt cannot fit:
/// 64 leaves room for vocabularies of long tokens (runs of spaces, code)
/// while a refused prompt costs at most this many bytes per position to
/// read.
pub const BYTES_PER_POSITION: usize = 64;

/// The most bytes of prompt text read for a context of `n_ctx` positions:
/// [`BYTES_PER_POSITION`] per position and 4 KiB more.
pub fn byte_limit(n_ctx: usize) -> usize {
    n_ctx.saturating_mul(BYTES_PER_POSITION).saturating_add(4096)
}

/// Everything `r` holds when it is at most `limit` bytes without one final
/// newline (`\n` or `\r\n`, kept in what is returned), else `None` after
/// reading at most `limit + 3` bytes: the rest is never read.
///
/// # Errors
/// Those of reading `r`.
pub fn read_at_most(r: impl Read, limit: usize) -> std::io::Result<Option<Vec<u8>>> {
    let cap = limit.saturating_add(3);
    let mut bytes = Vec::new();
    r.take(cap as u64).read_to_end(&mut bytes)?;
    if bytes.len() >= cap {
        // More than `limit` bytes even without a final "\r\n".
        return Ok(None);
    }
    let newline = if bytes.ends_with(b"\r\n") { 2 } else { usize::from(bytes.ends_with(b"\n")) };
    Ok((bytes.len() - newline <= limit).then_some(bytes))
}

#[cfg(test)]
mod tests {
    use super::{byte_limit, read_at_most};

    #[test]
    fn reads_up_to_the_limit_and_one_final_newline() {
        assert_eq!(byte_limit(0), 4096);
        assert_eq!(byte_limit(64), 64 * 64 + 4096);
        assert_eq!(byte_limit(usize::MAX), usize::MAX);
        let read = |s: &[u8], limit| read_at_most(s, limit).unwrap();
        assert_eq!(read(b"abcd", 4).as_deref(), Some(&b"abcd"[..]));
        assert_eq!(read(b"abcd\n", 4).as_deref(), Some(&b"abcd\n"[..]));
        assert_eq!(read(b"abcd\r\n", 4).as_deref(), Some(&b"abcd\r\n"[..]));
        assert_eq!(read(b"abcde", 4), None);
        assert_eq!(read(b"abcd\n\n", 4), None);
        assert_eq!(read(b"", 0).as_deref(), Some(&b""[..]));
    }

    #[test]
    fn a_longer_input_is_not_read_past_the_limit() {
        // An endless reader: only `limit + 3` bytes are taken from it.
        let mut endless = std::io::repeat(b'x');
        assert_eq!(read_at_most(&mut endless, 1000).unwrap(), None);
        let mut counted = CountingReader { inner: std::io::repeat(b'x'), read: 0 };
        assert_eq!(read_at_most(&mut counted, 1000).unwrap(), None);
        assert_eq!(counted.read, 1003);
    }

    struct CountingReader<R> {
        inner: R,
        read: usize,
    }

    impl<R: std::io::Read> std::io::Read for CountingReader<R> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = self.inner.read(buf)?;
            self.read += n;
            Ok(n)
        }
    }
}
