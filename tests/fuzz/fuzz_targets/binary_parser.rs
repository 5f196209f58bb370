#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| memkeep_fuzz::binary_parser(data));
