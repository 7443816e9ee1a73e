//! Signing in and out of the review desk, and what every page needs of the session: the
//! cookie, the signed-in reviewer, the same-origin check of a form post.

use super::*;

/// The session cookie's name on this desk.
fn cookie_name(desk: &Desk) -> &'static str {
    if desk.secure_cookie {
        auth::COOKIE
    } else {
        auth::INSECURE_COOKIE
    }
}

/// The session cookie's value, if the request carries one.
pub(super) fn cookie<'h>(desk: &Desk, headers: &'h HeaderMap) -> Option<&'h str> {
    let name = cookie_name(desk);
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(n, _)| *n == name)
        .map(|(_, value)| value)
}

/// The signed-in reviewer with the session's cookie value.
pub(super) fn session(desk: &Desk, headers: &HeaderMap) -> Option<(String, Reviewer)> {
    let value = cookie(desk, headers)?;
    let r = desk.sessions.check(&desk.reviewers, value)?;
    Some((value.to_owned(), r))
}

pub(super) fn who(desk: &Desk, value: &str, r: &Reviewer) -> Who {
    Who {
        id: r.id.clone(),
        role: r.role.as_str(),
        approve: r.approve,
        csrf: desk.sessions.csrf(value),
    }
}

/// Whether a form post comes from a page of this host: an `Origin` (or, without one, a
/// `Sec-Fetch-Site`) naming another site is refused before anything else is looked at.
pub(super) fn same_origin(headers: &HeaderMap) -> bool {
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    if let Some(origin) = headers.get(header::ORIGIN) {
        let Ok(origin) = origin.to_str() else {
            return false;
        };
        let authority = origin.split_once("://").map(|(_, a)| a);
        return authority.is_some() && authority == host;
    }
    headers
        .get("sec-fetch-site")
        .and_then(|v| v.to_str().ok())
        .is_none_or(|v| v == "same-origin" || v == "none")
}

pub(super) fn cross_site() -> Response {
    message(
        StatusCode::FORBIDDEN,
        None,
        "Refused",
        "This form was posted from another site. Open the review desk and try again.",
        "/desk/reviews",
    )
}

pub(super) fn set_cookie(desk: &Desk, value: &str, max_age: u64) -> HeaderValue {
    let name = cookie_name(desk);
    // `__Host-` requires `Path=/`; the plain-HTTP cookie stays under /desk.
    let (path, secure) = if desk.secure_cookie {
        ("/", "; Secure")
    } else {
        ("/desk", "")
    };
    HeaderValue::from_str(&format!(
        "{name}={value}; Path={path}; Max-Age={max_age}; HttpOnly; SameSite=Strict{secure}"
    ))
    .unwrap_or_else(|_| HeaderValue::from_static("oncely_desk=; Path=/desk; Max-Age=0"))
}

pub(super) async fn login_page(State(desk): St, headers: HeaderMap) -> Response {
    if session(&desk, &headers).is_some() {
        return Redirect::to("/desk/reviews").into_response();
    }
    render(
        StatusCode::OK,
        &LoginPage {
            who: None,
            error: None,
        },
    )
}

#[derive(Deserialize)]
pub(super) struct LoginForm {
    #[serde(default)]
    token: String,
}

pub(super) async fn login(
    State(desk): St,
    headers: HeaderMap,
    Form(f): Form<LoginForm>,
) -> Response {
    if !same_origin(&headers) {
        return cross_site();
    }
    match desk.sessions.sign_in(&desk.reviewers, f.token.trim()) {
        Some((value, r)) => {
            tracing::info!(reviewer = %r.id, role = r.role.as_str(), "review desk: signed in");
            let mut resp = Redirect::to("/desk/reviews").into_response();
            resp.headers_mut().insert(
                header::SET_COOKIE,
                set_cookie(&desk, &value, desk.sessions.ttl().as_secs()),
            );
            resp
        }
        None => {
            tracing::warn!("review desk: sign-in with an unknown token");
            render(
                StatusCode::UNAUTHORIZED,
                &LoginPage {
                    who: None,
                    error: Some("That token is not in the reviewers file.".into()),
                },
            )
        }
    }
}

#[derive(Deserialize)]
pub(super) struct CsrfForm {
    #[serde(default)]
    csrf: String,
}

pub(super) async fn logout(
    State(desk): St,
    headers: HeaderMap,
    Form(f): Form<CsrfForm>,
) -> Response {
    if !same_origin(&headers) {
        return cross_site();
    }
    if let Some(value) = cookie(&desk, &headers)
        && !desk.sessions.csrf_ok(value, &f.csrf)
    {
        return message(
            StatusCode::FORBIDDEN,
            None,
            "Refused",
            "The form's CSRF token does not match your session.",
            "/desk/reviews",
        );
    }
    let mut resp = Redirect::to("/desk/login").into_response();
    resp.headers_mut()
        .insert(header::SET_COOKIE, set_cookie(&desk, "", 0));
    resp
}
