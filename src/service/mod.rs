//! Workflows shared by the CLI and the admin console (and, as they move here,
//! the REST API): each validates, writes its rows and its audit event in one
//! transaction, and returns a typed refusal the caller translates.

pub mod accounts;
pub mod keys;
pub mod memberships;
