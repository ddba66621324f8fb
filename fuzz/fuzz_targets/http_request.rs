#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = weft_http::read_request(&mut &data[..]);
});
