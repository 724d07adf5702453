//! Ranks' output, forwarded line by line: whole lines only, so that ranks' lines never mix
//! within a line; with `--tag-output` each line is prefixed `[1,RANK]<stdout>:` (or
//! `<stderr>`), as mpirun does.

use std::io::Write;

/// A line longer than this is forwarded in pieces of this size.
pub const MAX_LINE: usize = 64 * 1024;

/// Which of the rank's streams.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    /// Standard output.
    Out,
    /// Standard error.
    Err,
}

/// One rank's stream: bytes in, whole lines out.
pub struct Lines {
    prefix: Option<String>,
    buf: Vec<u8>,
}

impl Lines {
    /// A stream of `rank`, tagged or not.
    pub fn new(rank: u32, stream: Stream, tag: bool) -> Lines {
        let prefix = tag.then(|| {
            let s = match stream {
                Stream::Out => "stdout",
                Stream::Err => "stderr",
            };
            format!("[1,{rank}]<{s}>:")
        });
        Lines {
            prefix,
            buf: Vec::new(),
        }
    }

    /// Take `data`; what is now whole lines goes to `out`.
    pub fn push(&mut self, data: &[u8], out: &mut Vec<u8>) {
        self.buf.extend_from_slice(data);
        let mut start = 0;
        while let Some(p) = self.buf[start..].iter().position(|&b| b == b'\n') {
            let end = start + p + 1;
            self.emit(start, end, out);
            start = end;
        }
        while self.buf.len() - start >= MAX_LINE {
            let end = start + MAX_LINE;
            self.emit(start, end, out);
            out.push(b'\n');
            start = end;
        }
        self.buf.drain(..start);
    }

    fn emit(&self, start: usize, end: usize, out: &mut Vec<u8>) {
        if let Some(p) = &self.prefix {
            out.extend_from_slice(p.as_bytes());
        }
        out.extend_from_slice(&self.buf[start..end]);
    }

    /// The stream ended: the last, unterminated line (with a newline added).
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        if !self.buf.is_empty() {
            let n = self.buf.len();
            self.emit(0, n, out);
            out.push(b'\n');
            self.buf.clear();
        }
    }
}

/// Write `data` to our stdout or stderr; false once the reader has gone (output is then
/// dropped, the job goes on).
pub fn write_to(stream: Stream, data: &[u8]) -> bool {
    if data.is_empty() {
        return true;
    }
    let r = match stream {
        Stream::Out => {
            let mut o = std::io::stdout().lock();
            o.write_all(data).and_then(|_| o.flush())
        }
        Stream::Err => {
            let mut e = std::io::stderr().lock();
            e.write_all(data).and_then(|_| e.flush())
        }
    };
    r.is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_lines_with_tags() {
        let mut l = Lines::new(3, Stream::Out, true);
        let mut out = Vec::new();
        l.push(b"hel", &mut out);
        assert!(out.is_empty());
        l.push(b"lo\nwor", &mut out);
        assert_eq!(out, b"[1,3]<stdout>:hello\n");
        out.clear();
        l.push(b"ld\n\nx", &mut out);
        assert_eq!(out, b"[1,3]<stdout>:world\n[1,3]<stdout>:\n");
        out.clear();
        l.finish(&mut out);
        assert_eq!(out, b"[1,3]<stdout>:x\n");
        let mut l = Lines::new(0, Stream::Err, false);
        let mut out = Vec::new();
        l.push(b"a\nb", &mut out);
        assert_eq!(out, b"a\n");
        let mut l = Lines::new(1, Stream::Err, true);
        let mut out = Vec::new();
        l.push(&vec![b'z'; MAX_LINE + 5], &mut out);
        assert_eq!(out.len(), "[1,1]<stderr>:".len() + MAX_LINE + 1);
    }
}
