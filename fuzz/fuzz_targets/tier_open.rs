#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| weft_volume::testing::fuzz_tier_open(data));
