//! The markup that needs no session: every page's `<head>` and the sign-in
//! page (`session` renders it; `view`'s frame needs a `Session`, so this sits
//! below both).

use axum::response::Html;
use maud::{html, Markup, DOCTYPE};

/// Every page's `<head>`.
pub fn head(title: &str) -> Markup {
    html! {
        head {
            meta charset="utf-8";
            meta name="viewport" content="width=device-width, initial-scale=1";
            title { (title) " · Mnemosyne admin" }
            link rel="stylesheet" href="/admin/static/admin.css";
        }
    }
}

/// The sign-in page.
pub fn login(username: &str, csrf_token: &str, error: Option<&str>, next: Option<&str>) -> Html<String> {
    Html(
        html! {
            (DOCTYPE)
            html lang="en" {
                (head("Sign in"))
                body {
                    main.narrow {
                        h1 { "Mnemosyne admin" }
                        @if let Some(e) = error {
                            p.error role="alert" { (e) }
                        }
                        form.stack method="post" action="/admin/login" {
                            input type="hidden" name="csrf" value=(csrf_token);
                            @if let Some(n) = next {
                                input type="hidden" name="next" value=(n);
                            }
                            label { "Username"
                                input type="text" name="username" value=(username) autocomplete="username" required autofocus;
                            }
                            label { "Password"
                                input type="password" name="password" autocomplete="current-password" required;
                            }
                            button type="submit" { "Sign in" }
                        }
                    }
                }
            }
        }
        .into_string(),
    )
}
