//! `auth-type: basic` with `auth-secret` (`auth-secret-type` `auth-file` or `auth-map`) and
//! `auth-realm`: the users and htpasswd hashes of a Secret in the Ingress's namespace.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use weir_dataplane::model::{BasicAuth, ObjectRef};
use weir_dataplane::route::auth::HashKind;

/// The users of an htpasswd text (`user:hash` lines); lines that cannot serve are described in
/// `skipped` (line number and why).
pub(super) fn htpasswd(text: &str, skipped: &mut Vec<String>) -> BTreeMap<String, String> {
    let mut users = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        match user_entry(line) {
            Ok((user, hash)) => {
                users.insert(user.to_string(), hash.to_string());
            }
            Err(why) => skipped.push(format!("line {}: {why}", i + 1)),
        }
    }
    users
}

/// One `user:hash`.
fn user_entry(line: &str) -> Result<(&str, &str), String> {
    let (user, hash) = line.split_once(':').ok_or("not user:hash")?;
    check_hash(user, hash)?;
    Ok((user, hash))
}

fn check_hash(user: &str, hash: &str) -> Result<(), String> {
    if user.is_empty() {
        return Err("empty user name".into());
    }
    if HashKind::of(hash).is_none() {
        return Err(format!(
            "user {user:?}: unsupported hash (use bcrypt $2y$, APR1 $apr1$, MD5 $1$, {{SHA}} or {{PLAIN}})"
        ));
    }
    Ok(())
}

/// The users of a Secret: `auth-file` reads its `auth` key as htpasswd text; `auth-map` takes
/// each key as a user and its value as the hash.
pub(super) fn users(
    secret: &Secret,
    map: bool,
    skipped: &mut Vec<String>,
) -> Result<BTreeMap<String, String>, String> {
    let data = secret.data.as_ref();
    if map {
        let mut users = BTreeMap::new();
        for (user, value) in data.into_iter().flatten() {
            let hash = String::from_utf8_lossy(&value.0);
            match check_hash(user, hash.trim()) {
                Ok(()) => {
                    users.insert(user.clone(), hash.trim().to_string());
                }
                Err(why) => skipped.push(format!("key {user:?}: {why}")),
            }
        }
        return Ok(users);
    }
    let text = data.and_then(|d| d.get("auth")).ok_or("has no \"auth\" key (htpasswd text)")?;
    let text = std::str::from_utf8(&text.0).map_err(|_| "its \"auth\" key is not text")?;
    Ok(htpasswd(text, skipped))
}

/// The Secret an `auth-secret` value names: `name`, or `namespace/name` with the Ingress's own
/// namespace (another namespace's Secret is refused unless `allow-cross-namespace-resources`:
/// an Ingress must not read what its namespace cannot).
pub(super) fn secret_ref(
    ingress: &ObjectRef,
    value: &str,
    guards: &super::risk::Guards,
) -> Result<ObjectRef, String> {
    let (ns, name) = value.split_once('/').unwrap_or((&ingress.namespace, value));
    if name.is_empty() || name.contains('/') || ns.is_empty() {
        return Err("expected a Secret name".into());
    }
    if !guards.may_reach(&ingress.namespace, ns) {
        return Err(format!(
            "the Secret must be in the Ingress's namespace {:?}, not {ns:?} (allow-cross-namespace-resources is off)",
            ingress.namespace
        ));
    }
    Ok(ObjectRef::new(ns, name))
}

/// Assembles the policy.
pub(super) fn basic(realm: String, users: BTreeMap<String, String>) -> BasicAuth {
    BasicAuth { realm, users }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn htpasswd_lines() {
        let mut skipped = Vec::new();
        let users = htpasswd(
            "# staff\nalice:$apr1$abcdefgh$r/p0TRuenjeL4j5EsxbGb/\nbob:$6$salt$sha512crypt\n\ncarol\n",
            &mut skipped,
        );
        assert_eq!(users.keys().collect::<Vec<_>>(), ["alice"]);
        assert_eq!(skipped.len(), 2, "{skipped:?}");
        assert!(skipped[0].starts_with("line 3: user \"bob\": unsupported hash"), "{skipped:?}");
        assert!(skipped[1].starts_with("line 5: not user:hash"), "{skipped:?}");
    }

    #[test]
    fn secret_refs_stay_in_the_namespace() {
        let ing = ObjectRef::new("shop", "web");
        let strict = super::super::risk::Guards::default();
        assert_eq!(secret_ref(&ing, "users", &strict).unwrap(), ObjectRef::new("shop", "users"));
        assert_eq!(secret_ref(&ing, "shop/users", &strict).unwrap(), ObjectRef::new("shop", "users"));
        assert!(secret_ref(&ing, "kube-system/users", &strict).is_err());
        assert!(secret_ref(&ing, "a/b/c", &strict).is_err());
        let open = super::super::risk::Guards { cross_namespace: true, ..strict };
        assert_eq!(
            secret_ref(&ing, "kube-system/users", &open).unwrap(),
            ObjectRef::new("kube-system", "users")
        );
    }
}
