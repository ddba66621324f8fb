//! The web dashboard's files (`/ui/`), built into the binary: no CDN and no
//! network access needed (an air-gapped data centre). The files hold no
//! data and are served to anyone; the page asks for an API token and reads
//! everything through the API, which checks it as for any client (a
//! read-only token can look, an admin token can act). Strict headers: the
//! page runs only its own script and style, in no frame.

use std::io::Write;

/// Headers of every dashboard response: its own script and style only, no
/// framing, no sniffing, no referrer, no caching (a new build's files).
const HEADERS: &[(&str, &str)] = &[
    (
        "Content-Security-Policy",
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'",
    ),
    ("X-Content-Type-Options", "nosniff"),
    ("X-Frame-Options", "DENY"),
    ("Referrer-Policy", "no-referrer"),
    ("Cache-Control", "no-store"),
];

/// The dashboard's file at `path` (the request's path) and its type.
fn asset(path: &str) -> Option<(&'static str, &'static [u8])> {
    Some(match path {
        "/ui/" | "/ui/index.html" => (
            "text/html; charset=utf-8",
            include_bytes!("ui/index.html").as_slice(),
        ),
        "/ui/app.js" => (
            "text/javascript; charset=utf-8",
            include_bytes!("ui/app.js").as_slice(),
        ),
        "/ui/actions.js" => (
            "text/javascript; charset=utf-8",
            include_bytes!("ui/actions.js").as_slice(),
        ),
        "/ui/app.css" => (
            "text/css; charset=utf-8",
            include_bytes!("ui/app.css").as_slice(),
        ),
        _ => return None,
    })
}

/// Answers a GET of the dashboard (`/`, `/ui` and the files under `/ui/`);
/// false if `path` is none of them.
pub(crate) fn serve(stream: &mut impl Write, path: &str) -> bool {
    if path == "/" || path == "/ui" {
        let mut headers = HEADERS.to_vec();
        headers.push(("Location", "/ui/"));
        let _ = weft_http::write_response_with(stream, 308, "text/plain", &headers, b"/ui/\n");
        return true;
    }
    let Some((content_type, body)) = asset(path) else {
        return false;
    };
    let _ = weft_http::write_response_with(stream, 200, content_type, HEADERS, body);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_files_are_built_in_with_strict_headers() {
        let mut out = Vec::new();
        assert!(serve(&mut out, "/ui/"));
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
        assert!(text.contains("Content-Security-Policy: default-src 'none'; script-src 'self';"));
        assert!(text.contains("X-Frame-Options: DENY\r\n"));
        assert!(text.contains("<script src=\"/ui/app.js\" defer></script>"));
        assert!(
            !text.contains("<script>"),
            "no inline script: the policy forbids it"
        );
        let mut out = Vec::new();
        assert!(serve(&mut out, "/"));
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.starts_with("HTTP/1.1 308 Permanent Redirect\r\n")
                && text.contains("Location: /ui/\r\n")
        );
        assert!(!serve(&mut Vec::new(), "/ui/../api-token"));
        assert!(!serve(&mut Vec::new(), "/api/v1/volumes"));
    }
}
