//! Bearer → `resolved_libraries` (DESIGN §3), and the Basic service account.

pub mod basic;
pub mod cache;
pub mod changes;
pub mod failure;
pub mod jwt;
pub mod principal;
pub mod resolver;

pub use failure::{AuthError, AuthFailure};
pub use principal::{Principal, PrincipalKind, Scope, ToolGrant};
pub use resolver::Authenticator;
