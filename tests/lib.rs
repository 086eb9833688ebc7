//! Regression and integration tests for nanhunt live in `integration/`.
