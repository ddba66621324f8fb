//! Just enough HTTP/1.1 for the node's control API and the CLI that calls
//! it: one request per connection (`Connection: close`), bodies sized by
//! Content-Length, a bearer token in Authorization, optionally over TLS
//! (rustls with ring: see [`tls`]). Headers are bounded so that a
//! misbehaving client cannot make the server allocate without limit. The
//! request parser takes bytes from the network: it is fuzzed (`fuzz/`,
//! target `http_request`) and never panics.
#![forbid(unsafe_code)]

mod deadline;
mod pair;
pub mod tls;

pub use deadline::{Deadline, DeadlineStream};

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

const HEADER_BYTES_MAX: usize = 16 * 1024;
const BODY_BYTES_MAX: usize = 1 << 20;

/// A parsed request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// GET, POST, DELETE...
    pub method: String,
    /// Path without the query.
    pub path: String,
    /// Query string (after '?'), may be empty.
    pub query: String,
    /// The Authorization header's value.
    pub authorization: Option<String>,
    /// Body bytes.
    pub body: Vec<u8>,
}

/// Reads one request from `stream`.
pub fn read_request(stream: &mut impl Read) -> io::Result<Request> {
    read_request_after_head(stream, || {})
}

/// Reads one request from `stream`, calling `head_read` once its head is
/// in (a server moves a short deadline for the head to the whole request's).
pub fn read_request_after_head(
    stream: &mut impl Read,
    head_read: impl FnOnce(),
) -> io::Result<Request> {
    let mut reader = BufReader::new(stream);
    let head = read_head(&mut reader)?;
    head_read();
    let start = head.first_line;
    let mut parts = start.split_whitespace();
    let (Some(method), Some(target)) = (parts.next(), parts.next()) else {
        return Err(invalid("malformed request line"));
    };
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let body = read_body(&mut reader, head.content_length)?;
    Ok(Request {
        method: method.to_string(),
        path: path.to_string(),
        query: query.to_string(),
        authorization: head.authorization,
        body,
    })
}

/// Content type of JSON bodies.
pub const JSON: &str = "application/json";

/// Writes a response of `content_type` and closes.
pub fn write_response(
    stream: &mut impl Write,
    status: u16,
    content_type: &str,
    body: &[u8],
) -> io::Result<()> {
    write_response_with(stream, status, content_type, &[], body)
}

/// Writes a response of `content_type` with the `headers` given (name,
/// value: fixed text, never what a client sent) and closes.
pub fn write_response_with(
    stream: &mut impl Write,
    status: u16,
    content_type: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> io::Result<()> {
    let challenge = if status == 401 {
        "WWW-Authenticate: Bearer\r\n"
    } else {
        ""
    };
    let extra: String = headers
        .iter()
        .map(|(name, value)| format!("{name}: {value}\r\n"))
        .collect();
    let head = format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n{challenge}{extra}Connection: close\r\n\r\n",
        reason(status),
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    stream.write_all(body)?;
    stream.flush()
}

/// Where the API is: `host:port`, plain or over TLS.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// `host:port`.
    pub address: String,
    /// TLS, when the URL was `https://`.
    pub tls: Option<tls::Client>,
}

impl Endpoint {
    /// From `http://host:port`, `https://host:port` or `host:port` (plain);
    /// `https` trusts the CA certificates in `ca_file` (PEM), or the
    /// system's bundle when none is given.
    pub fn parse(url: &str, ca_file: Option<&std::path::Path>) -> Result<Endpoint, String> {
        let url = url.trim_end_matches('/');
        if let Some(address) = url.strip_prefix("https://") {
            let host = address.rsplit_once(':').map_or(address, |(host, _)| host);
            Ok(Endpoint {
                address: address.to_string(),
                tls: Some(tls::Client::new(host, ca_file)?),
            })
        } else {
            let address = url.strip_prefix("http://").unwrap_or(url);
            Ok(Endpoint {
                address: address.to_string(),
                tls: None,
            })
        }
    }
}

impl Endpoint {
    /// `https://host:port` trusting no certificate ([`tls::Client::unverified`]):
    /// for what is checked by other means, never for anything secret.
    pub fn unverified(url: &str) -> Result<Endpoint, String> {
        let address = url
            .trim_end_matches('/')
            .strip_prefix("https://")
            .ok_or_else(|| format!("{url}: give an https:// URL"))?;
        let host = address.rsplit_once(':').map_or(address, |(host, _)| host);
        Ok(Endpoint {
            address: address.to_string(),
            tls: Some(tls::Client::unverified(host)?),
        })
    }
}

/// Sends one request to `endpoint`, with `token` as bearer token if given,
/// and returns status and body.
pub fn call(
    endpoint: &Endpoint,
    token: Option<&str>,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
    timeout: Duration,
) -> io::Result<(u16, Vec<u8>)> {
    let stream = connect(&endpoint.address, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    match &endpoint.tls {
        None => exchange(stream, &endpoint.address, token, method, path, body),
        Some(client) => {
            let stream = client.connect(stream)?;
            exchange(stream, &endpoint.address, token, method, path, body)
        }
    }
}

/// Whether `error` is a socket's read or write deadline passing (Linux
/// reports it as `WouldBlock`).
pub fn is_timeout(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
    )
}

/// Connects to the first of `address`'s addresses that answers within
/// `timeout` (an address that drops packets would otherwise take the
/// kernel's two minutes of SYN retries).
fn connect(address: &str, timeout: Duration) -> io::Result<TcpStream> {
    let mut last = io::Error::new(
        io::ErrorKind::NotFound,
        format!("{address} resolves to no address"),
    );
    for candidate in address.to_socket_addrs()? {
        match TcpStream::connect_timeout(&candidate, timeout) {
            Ok(stream) => return Ok(stream),
            Err(error) => last = error,
        }
    }
    Err(last)
}

fn exchange(
    mut stream: impl Read + Write,
    address: &str,
    token: Option<&str>,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
) -> io::Result<(u16, Vec<u8>)> {
    let body = body.unwrap_or_default();
    let authorization = token
        .map(|token| format!("Authorization: Bearer {token}\r\n"))
        .unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\n{authorization}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    stream.write_all(body)?;
    let mut reader = BufReader::new(stream);
    let head = read_head(&mut reader)?;
    let status = head
        .first_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| invalid("malformed status line"))?;
    Ok((status, read_body(&mut reader, head.content_length)?))
}

/// What the server and the client read of a head.
struct Head {
    first_line: String,
    content_length: usize,
    authorization: Option<String>,
}

/// Reads a request or response head.
fn read_head(reader: &mut impl BufRead) -> io::Result<Head> {
    let mut head = Head {
        first_line: String::new(),
        content_length: 0,
        authorization: None,
    };
    let mut total = 0;
    loop {
        let mut line = String::new();
        let read = reader
            .by_ref()
            .take((HEADER_BYTES_MAX - total) as u64)
            .read_line(&mut line)?;
        total += read;
        if read == 0 || total >= HEADER_BYTES_MAX {
            return Err(invalid("header missing or too long"));
        }
        let line = line.trim_end();
        if head.first_line.is_empty() {
            head.first_line = line.to_string();
            continue;
        }
        if line.is_empty() {
            return Ok(head);
        }
        if let Some((name, value)) = line.split_once(':') {
            let name = name.trim();
            if name.eq_ignore_ascii_case("content-length") {
                head.content_length = value
                    .trim()
                    .parse()
                    .map_err(|_| invalid("bad Content-Length"))?;
            } else if name.eq_ignore_ascii_case("authorization") {
                head.authorization = Some(value.trim().to_string());
            }
        }
    }
}

fn read_body(reader: &mut impl Read, len: usize) -> io::Result<Vec<u8>> {
    if len > BODY_BYTES_MAX {
        return Err(invalid("body too large"));
    }
    let mut body = vec![0u8; len];
    reader.read_exact(&mut body)?;
    Ok(body)
}

fn invalid(message: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message.to_string())
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        308 => "Permanent Redirect",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        507 => "Insufficient Storage",
        _ => "Status",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_parse_and_limits_hold() {
        let raw = b"POST /api/v1/volumes?force=true HTTP/1.1\r\nHost: x\r\ncontent-length: 2\r\nAuthorization: Bearer abc\r\n\r\n{}";
        let request = read_request(&mut &raw[..]).unwrap();
        assert_eq!(request.method, "POST");
        assert_eq!(request.path, "/api/v1/volumes");
        assert_eq!(request.query, "force=true");
        assert_eq!(request.body, b"{}");
        assert_eq!(request.authorization.as_deref(), Some("Bearer abc"));
        let huge = format!(
            "GET / HTTP/1.1\r\nX: {}\r\n\r\n",
            "a".repeat(HEADER_BYTES_MAX)
        );
        assert!(read_request(&mut huge.as_bytes()).is_err());
        let big_body = b"POST / HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n";
        assert!(read_request(&mut &big_body[..]).is_err());
        let mut out = Vec::new();
        write_response(&mut out, 404, JSON, b"{}").unwrap();
        assert!(String::from_utf8(out)
            .unwrap()
            .starts_with("HTTP/1.1 404 Not Found\r\n"));
    }

    /// The API's parser takes bytes from the network: random and mutated
    /// requests give an error or a request, never a panic.
    #[test]
    fn random_and_mutated_requests_never_panic() {
        let valid = b"POST /api/v1/hosts HTTP/1.1\r\nAuthorization: Bearer t\r\nContent-Length: 13\r\n\r\n{\"name\": \"a\"}";
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for round in 0..20_000 {
            let mut bytes = valid.to_vec();
            if round % 2 == 0 {
                let len = (next() % 256) as usize;
                bytes = (0..len).map(|_| next() as u8).collect();
            } else {
                for _ in 0..1 + next() % 4 {
                    let at = (next() as usize) % bytes.len();
                    bytes[at] = next() as u8;
                }
                bytes.truncate((next() as usize) % (bytes.len() + 1));
            }
            let _ = read_request(&mut &bytes[..]);
        }
    }
}
