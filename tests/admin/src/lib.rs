//! Helpers for the admin and trace tests: a headless Chromium driven over
//! WebDriver ([`browser`]) and an OpenTelemetry setup whose exported spans
//! the tests read back ([`otel`]). The database fixtures come from
//! `keiro-tests`.

pub mod browser;
pub mod otel;
