//! The self-service page's "my libraries" section: what the account page
//! (`tokens::me_page`) shows and the member forms (`libraries::me_grant`,
//! `me_revoke`) answer with, so neither of those modules needs the other's
//! half.

use maud::html;

use super::session::Session;
use super::view::{self, urlencode, FieldError};
use super::{AdminError, FormData};
use crate::service::memberships::may_grant;
use crate::state::AppState;
use crate::store::pg::users::{self, Role};

/// The self-service page's "my libraries": memberships of the libraries the
/// user owns or manages, with what their role lets them grant or revoke.
pub(super) async fn section(
    state: &AppState,
    s: &Session,
    form: &FormData,
    err: &FieldError,
) -> Result<maud::Markup, AdminError> {
    let mine = users::memberships(&state.pg, Some(s.username()), None).await?;
    let mut libs: Vec<(String, Role)> = Vec::new();
    for m in &mine {
        let Some(r) = Role::parse(&m.role) else { continue };
        match libs.iter_mut().find(|(l, _)| *l == m.library_uid) {
            // Declaration order is strength order: owner, manager, reader.
            Some((_, best)) if (r as u8) < (*best as u8) => *best = r,
            Some(_) => {}
            None => libs.push((m.library_uid.clone(), r)),
        }
    }
    libs.retain(|(_, r)| *r != Role::Reader);
    let mut sections = Vec::new();
    for (uid, role) in &libs {
        let members = users::memberships(&state.pg, None, Some(uid)).await?;
        sections.push((uid.clone(), *role, members));
    }
    Ok(html! {
        @if !sections.is_empty() {
            h2 { "Libraries I own or manage" }
            p.muted { "An owner may grant any role, a manager only reader; a library keeps at least one owner." }
            @if err.field.starts_with("member") { p.error role="alert" { (err.message) } }
            @for (uid, role, members) in &sections {
                section.card {
                    p { code { (uid) } " — you are " b { (role.as_str()) }
                        " · " a href=(super::activity::link(uid)) { "Who read it" }
                        @if *role == Role::Owner { " · " a href={ "/admin/me/library?uid=" (urlencode(uid)) } { "Rename or delete…" } } }
                    div.table { table {
                        thead { tr { th { "User" } th { "Role" } th {} } }
                        tbody { @for m in members {
                            tr {
                                td { (m.username) }
                                td { (m.role) }
                                td { @if Role::parse(&m.role).is_some_and(|r| may_grant(Some(*role), r).is_ok()) {
                                    (view::action(s, "/admin/me/revoke", &[("library_uid", uid), ("username", &m.username), ("role", &m.role)], "Revoke", "danger"))
                                } }
                            }
                        } }
                    } }
                    form.row method="post" action="/admin/me/grant" {
                        (view::csrf(s))
                        input type="hidden" name="library_uid" value=(uid);
                        label { "Username" input type="text" name="username" required
                            value=(if form.get("library_uid") == uid { form.get("username") } else { "" }); }
                        label { "Role" select name="role" {
                            @for r in Role::ALL.into_iter().filter(|r| may_grant(Some(*role), *r).is_ok()) {
                                option value=(r.as_str()) { (r.as_str()) }
                            }
                        } }
                        button type="submit" { "Grant" }
                    }
                }
            }
        }
    })
}
