//! Conversation metadata: read and set with a compare-and-swap on its own
//! version, set at creation, bounded; and the conversation search built on
//! it: owner, metadata and time filters, keyset pages newest first that stay
//! stable while conversations are created.

use std::collections::HashSet;

use serde_json::{json, Value};
use turnstile_core::admin::{ConversationPage, ListFilter};
use turnstile_core::store::meta::{
    MAX_METADATA_BYTES, MAX_METADATA_KEYS, MAX_METADATA_KEY_BYTES, MAX_OWNER_BYTES, MAX_TITLE_BYTES,
};
use turnstile_core::store::{ConversationCursor, ConversationMeta, MetaUpdate};
use turnstile_core::{ConversationId, Error, Namespace, Revision, StoreAdmin};

use crate::activity::SharedAdmin;
use crate::admin::{filter, tick};
use crate::support::{new_conversation, ns, TestResult};

fn other_ns() -> Namespace {
    Namespace::new("conformance-other").expect("valid namespace")
}

fn update(title: Option<&str>, owner: Option<&str>, set: Value) -> MetaUpdate {
    MetaUpdate {
        title: title.map(|t| Some(t.to_owned())),
        owner: owner.map(|o| Some(o.to_owned())),
        set: match set {
            Value::Object(map) => map,
            _ => panic!("set is an object"),
        },
        unset: Vec::new(),
    }
}

async fn page(store: &dyn StoreAdmin, f: ListFilter) -> Result<ConversationPage, Error> {
    store.list_conversations(&f).await
}

async fn ids(store: &dyn StoreAdmin, f: ListFilter) -> Result<Vec<ConversationId>, Error> {
    Ok(page(store, f)
        .await?
        .conversations
        .into_iter()
        .map(|c| c.id)
        .collect())
}

pub async fn metadata_is_set_read_and_versioned_apart_from_the_admission(
    store: SharedAdmin,
) -> TestResult {
    let id = new_conversation(&*store).await?;
    let created = store.conversation(&ns(), id).await?;
    let empty = store.conversation_meta(&ns(), id).await?;
    assert_eq!(
        empty,
        ConversationMeta {
            title: None,
            owner: None,
            metadata: Default::default(),
            meta_version: 0,
            updated_at: created.created_at,
        }
    );
    tick().await;
    let first = update(
        Some("Trip"),
        Some("ana"),
        json!({"team": "x", "n": 3, "tags": [1, {"a": null}]}),
    );
    let set = store.set_conversation_meta(&ns(), id, 0, &first).await?;
    assert_eq!(set.meta_version, 1);
    assert_eq!(
        (set.title.as_deref(), set.owner.as_deref()),
        (Some("Trip"), Some("ana"))
    );
    assert_eq!(
        Value::Object(set.metadata.clone()),
        json!({"team": "x", "n": 3, "tags": [1, {"a": null}]})
    );
    assert!(set.updated_at > created.created_at);
    assert_eq!(store.conversation_meta(&ns(), id).await?, set);

    let second = MetaUpdate {
        title: Some(None),
        set: update(None, None, json!({"n": 4})).set,
        unset: vec!["team".into()],
        ..MetaUpdate::default()
    };
    let changed = store.set_conversation_meta(&ns(), id, 1, &second).await?;
    assert_eq!(changed.meta_version, 2);
    assert_eq!(
        (changed.title, changed.owner.as_deref()),
        (None, Some("ana"))
    );
    assert_eq!(
        Value::Object(changed.metadata),
        json!({"n": 4, "tags": [1, {"a": null}]})
    );
    // Labels never touch the admission: no run is fenced by them.
    let admission = store.admission(id).await?;
    assert_eq!(
        (admission.revision, admission.active.is_none()),
        (Revision(0), true)
    );
    Ok(())
}

pub async fn a_stale_meta_version_conflicts_and_writes_nothing(store: SharedAdmin) -> TestResult {
    let id = new_conversation(&*store).await?;
    let set = store
        .set_conversation_meta(&ns(), id, 0, &update(Some("a"), None, json!({"k": 1})))
        .await?;
    for stale in [0, 2, 9] {
        let again = update(Some("b"), Some("o"), json!({"k": 2}));
        match store.set_conversation_meta(&ns(), id, stale, &again).await {
            Err(Error::MetaVersionConflict {
                conversation_id,
                expected,
                actual,
            }) => assert_eq!((conversation_id, expected, actual), (id, stale, 1)),
            other => panic!("a stale version was not refused: {other:?}"),
        }
    }
    assert_eq!(store.conversation_meta(&ns(), id).await?, set);
    Ok(())
}

pub async fn metadata_set_at_creation_creates_the_conversation_idle(
    store: SharedAdmin,
) -> TestResult {
    let id = ConversationId::new();
    let set = store
        .set_conversation_meta(
            &ns(),
            id,
            0,
            &update(Some("new"), Some("bo"), json!({"a": "b"})),
        )
        .await?;
    assert_eq!(set.meta_version, 1);
    let conversation = store.conversation(&ns(), id).await?;
    assert_eq!(conversation.version, 0);
    let admission = store.admission(id).await?;
    assert_eq!(
        (admission.revision, admission.active.is_none()),
        (Revision(0), true)
    );
    assert_eq!(store.conversation_meta(&ns(), id).await?, set);

    // Any other version expects it to exist.
    let unknown = ConversationId::new();
    let refused = store
        .set_conversation_meta(&ns(), unknown, 1, &update(Some("x"), None, json!({})))
        .await;
    assert!(
        matches!(refused, Err(Error::NotFound { .. })),
        "{refused:?}"
    );
    assert!(matches!(
        store.conversation(&ns(), unknown).await,
        Err(Error::NotFound { .. })
    ));
    assert!(matches!(
        store.conversation_meta(&ns(), unknown).await,
        Err(Error::NotFound { .. })
    ));
    Ok(())
}

/// Updates that break a bound, each with the words that must say it.
fn bad_updates() -> Vec<(MetaUpdate, String)> {
    let with = |key: &str, value: Value| {
        let mut u = MetaUpdate::default();
        u.set.insert(key.to_owned(), value);
        u
    };
    let mut many = MetaUpdate::default();
    for i in 0..=MAX_METADATA_KEYS {
        many.set.insert(format!("k{i}"), json!(i));
    }
    vec![
        (
            update(Some(&"t".repeat(MAX_TITLE_BYTES + 1)), None, json!({})),
            format!("title must have 1 to {MAX_TITLE_BYTES} bytes"),
        ),
        (
            update(Some(""), None, json!({})),
            format!("title must have 1 to {MAX_TITLE_BYTES} bytes"),
        ),
        (
            update(None, Some(&"o".repeat(MAX_OWNER_BYTES + 1)), json!({})),
            format!("owner must have 1 to {MAX_OWNER_BYTES} bytes"),
        ),
        (update(None, Some("a\0b"), json!({})), "U+0000".into()),
        (many, format!("the limit of {MAX_METADATA_KEYS} keys")),
        (
            with("big", json!("x".repeat(MAX_METADATA_BYTES))),
            format!("the limit of {MAX_METADATA_BYTES} bytes"),
        ),
        (
            with(&"k".repeat(MAX_METADATA_KEY_BYTES + 1), json!(1)),
            format!("must have 1 to {MAX_METADATA_KEY_BYTES} bytes"),
        ),
        (
            with("", json!(1)),
            format!("must have 1 to {MAX_METADATA_KEY_BYTES} bytes"),
        ),
        (with("a\"b", json!(1)), "ASCII letters".into()),
        (with("k", json!({"deep": ["a\0"]})), "U+0000".into()),
        (
            MetaUpdate {
                unset: vec!["k".into()],
                ..with("k", json!(1))
            },
            "both set and unset".into(),
        ),
    ]
}

pub async fn metadata_out_of_bounds_is_refused_naming_the_bound_and_writes_nothing(
    store: SharedAdmin,
) -> TestResult {
    let id = new_conversation(&*store).await?;
    let before = store
        .set_conversation_meta(
            &ns(),
            id,
            0,
            &update(Some("kept"), Some("me"), json!({"k": 1})),
        )
        .await?;
    let fresh = ConversationId::new();
    for (bad, bound) in bad_updates() {
        match store.set_conversation_meta(&ns(), id, 1, &bad).await {
            Err(Error::InvalidInput(why)) => {
                assert!(why.contains(&bound), "{bound}: {why}");
                // A limit in words and bytes, not the constant's name.
                assert!(!why.contains("MAX_"), "{why}");
            }
            other => panic!("{bound} was not refused: {other:?}"),
        }
        // Refused at creation: the conversation is not created either.
        let created = store.set_conversation_meta(&ns(), fresh, 0, &bad).await;
        assert!(
            matches!(created, Err(Error::InvalidInput(_))),
            "{created:?}"
        );
        assert!(matches!(
            store.conversation(&ns(), fresh).await,
            Err(Error::NotFound { .. })
        ));
    }
    // A result past a bound is refused too: 64 keys, then one more.
    let mut full = MetaUpdate::default();
    for i in 1..MAX_METADATA_KEYS {
        full.set.insert(format!("f{i}"), json!(i));
    }
    let at_bound = store.set_conversation_meta(&ns(), id, 1, &full).await?;
    assert_eq!(at_bound.metadata.len(), MAX_METADATA_KEYS);
    let one_more = update(None, None, json!({"extra": true}));
    let refused = store.set_conversation_meta(&ns(), id, 2, &one_more).await;
    assert!(
        matches!(refused, Err(Error::InvalidInput(_))),
        "{refused:?}"
    );
    assert_eq!(store.conversation_meta(&ns(), id).await?, at_bound);
    assert_eq!(at_bound.title, before.title);
    Ok(())
}

pub async fn metadata_of_another_namespace_is_a_namespace_mismatch(
    store: SharedAdmin,
) -> TestResult {
    let id = new_conversation(&*store).await?;
    let mine = store
        .set_conversation_meta(&ns(), id, 0, &update(Some("mine"), None, json!({})))
        .await?;
    let read = store.conversation_meta(&other_ns(), id).await;
    assert!(
        matches!(read, Err(Error::NamespaceMismatch { .. })),
        "{read:?}"
    );
    for version in [0, 1] {
        let write = store
            .set_conversation_meta(
                &other_ns(),
                id,
                version,
                &update(Some("theirs"), None, json!({})),
            )
            .await;
        assert!(
            matches!(write, Err(Error::NamespaceMismatch { .. })),
            "{write:?}"
        );
    }
    assert_eq!(store.conversation_meta(&ns(), id).await?, mine);
    Ok(())
}

pub async fn conversation_listing_filters_by_owner_metadata_and_times(
    store: SharedAdmin,
) -> TestResult {
    // Oldest first: a (ana, team x, n 1), b (ana, team y, flag), c (bo,
    // team x, n null), d (no metadata).
    let mut made = Vec::new();
    let sets = [
        (Some("ana"), json!({"team": "x", "n": 1})),
        (Some("ana"), json!({"team": "y", "flag": true})),
        (Some("bo"), json!({"team": "x", "n": null})),
        (None, json!({})),
    ];
    for (owner, set) in sets {
        let id = new_conversation(&*store).await?;
        store
            .set_conversation_meta(&ns(), id, 0, &update(None, owner, set))
            .await?;
        made.push(id);
        tick().await;
    }
    let [a, b, c, d] = made[..] else {
        unreachable!()
    };
    let all = ids(&*store, filter()).await?;
    assert_eq!(all, [d, c, b, a]);
    let listed = page(&*store, filter()).await?.conversations;
    assert_eq!(listed[3].meta.owner.as_deref(), Some("ana"));
    assert_eq!(listed[3].meta.metadata["team"], json!("x"));

    let owned = |o: &str| ListFilter {
        owner: Some(o.into()),
        ..filter()
    };
    assert_eq!(ids(&*store, owned("ana")).await?, [b, a]);
    assert_eq!(ids(&*store, owned("bo")).await?, [c]);
    assert!(ids(&*store, owned("nobody")).await?.is_empty());
    let meta = |k: &str, v: Value| ListFilter {
        meta: Some((k.into(), v)),
        ..filter()
    };
    assert_eq!(ids(&*store, meta("team", json!("x"))).await?, [c, a]);
    assert_eq!(ids(&*store, meta("n", json!(1))).await?, [a]);
    // The string "1" is not the number 1; null is not a missing key.
    assert!(ids(&*store, meta("n", json!("1"))).await?.is_empty());
    assert_eq!(ids(&*store, meta("n", json!(null))).await?, [c]);
    assert_eq!(ids(&*store, meta("flag", json!(true))).await?, [b]);
    assert!(ids(&*store, meta("flag", json!(false))).await?.is_empty());
    let both = ListFilter {
        owner: Some("ana".into()),
        ..meta("team", json!("x"))
    };
    assert_eq!(ids(&*store, both).await?, [a]);

    // Times: created in [b, d), and updated since a change made to a.
    let times: Vec<i64> = listed.iter().rev().map(|s| s.created_at).collect();
    let created = ListFilter {
        created_after: Some(times[1]),
        created_before: Some(times[3]),
        ..filter()
    };
    assert_eq!(ids(&*store, created).await?, [c, b]);
    tick().await;
    let a_meta = store.conversation_meta(&ns(), a).await?;
    let touched = store
        .set_conversation_meta(
            &ns(),
            a,
            a_meta.meta_version,
            &update(Some("again"), None, json!({})),
        )
        .await?;
    let updated_since = ListFilter {
        updated_after: Some(touched.updated_at),
        ..filter()
    };
    assert_eq!(ids(&*store, updated_since).await?, [a]);
    let updated_before = ListFilter {
        updated_before: Some(touched.updated_at),
        ..filter()
    };
    assert_eq!(ids(&*store, updated_before).await?, [d, c, b]);
    // Filters also hold where conversations are chosen otherwise.
    let one = ListFilter {
        conversation_id: Some(b),
        owner: Some("bo".into()),
        ..filter()
    };
    assert!(ids(&*store, one).await?.is_empty());

    // Filters a backend could not match alike are refused.
    for bad in [
        meta("n", json!(1.5)),
        meta("n", json!([1])),
        meta("bad key", json!(1)),
        owned(""),
    ] {
        let refused = page(&*store, bad).await;
        assert!(
            matches!(refused, Err(Error::InvalidInput(_))),
            "{refused:?}"
        );
    }
    Ok(())
}

/// Every page of a walk from the start, `limit` at a time.
async fn walk(store: &dyn StoreAdmin, base: ListFilter) -> Result<Vec<Vec<ConversationId>>, Error> {
    let mut pages = Vec::new();
    let mut after = None;
    loop {
        let next = page(
            store,
            ListFilter {
                after,
                ..base.clone()
            },
        )
        .await?;
        pages.push(next.conversations.iter().map(|c| c.id).collect());
        match next.next {
            Some(cursor) => after = Some(cursor),
            None => return Ok(pages),
        }
    }
}

pub async fn pages_walk_every_conversation_once_newest_first(store: SharedAdmin) -> TestResult {
    for _ in 0..7 {
        new_conversation(&*store).await?;
    }
    let all = ids(
        &*store,
        ListFilter {
            limit: 100,
            ..filter()
        },
    )
    .await?;
    assert_eq!(all.len(), 7);
    let pages = walk(
        &*store,
        ListFilter {
            limit: 3,
            ..filter()
        },
    )
    .await?;
    assert_eq!(pages.iter().map(Vec::len).collect::<Vec<_>>(), [3, 3, 1]);
    assert_eq!(pages.concat(), all);
    // A page that ends exactly at the end says so: no empty page after it.
    let exact = walk(
        &*store,
        ListFilter {
            limit: 7,
            ..filter()
        },
    )
    .await?;
    assert_eq!(exact, std::slice::from_ref(&all));
    // Pages of a filtered listing walk only what matches.
    let elsewhere = walk(
        &*store,
        ListFilter {
            namespace: Some(other_ns()),
            limit: 2,
            ..filter()
        },
    )
    .await?;
    assert_eq!(elsewhere, [Vec::<ConversationId>::new()]);
    // A cursor names a position, not a row: one made up lists what is older.
    let listed = page(
        &*store,
        ListFilter {
            limit: 100,
            ..filter()
        },
    )
    .await?
    .conversations;
    let middle = &listed[3];
    let made_up = ConversationCursor::new(middle.created_at, middle.id);
    let rest = ids(
        &*store,
        ListFilter {
            after: Some(made_up),
            limit: 100,
            ..filter()
        },
    )
    .await?;
    assert_eq!(rest, all[4..]);
    // Garbage never becomes a cursor.
    for garbage in ["", "next", "c12_xyz", "c_", "12"] {
        let parsed = garbage.parse::<ConversationCursor>();
        assert!(matches!(parsed, Err(Error::InvalidInput(_))), "{garbage:?}");
    }
    let printed: ConversationCursor = made_up.to_string().parse()?;
    assert_eq!(printed, made_up);
    Ok(())
}

pub async fn pages_stay_stable_while_conversations_are_created(store: SharedAdmin) -> TestResult {
    let mut existing = HashSet::new();
    for _ in 0..20 {
        existing.insert(new_conversation(&*store).await?);
        tokio::task::yield_now().await;
    }
    // Other tasks create conversations while the walk goes on.
    let creators: Vec<_> = (0..2)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut created = Vec::new();
                for _ in 0..15 {
                    created.push(new_conversation(&*store).await?);
                    tokio::task::yield_now().await;
                }
                Ok::<_, Error>(created)
            })
        })
        .collect();
    let pages = walk(
        &*store,
        ListFilter {
            limit: 3,
            ..filter()
        },
    )
    .await?;
    let mut created = HashSet::new();
    for creator in creators {
        created.extend(creator.await??);
    }
    let walked: Vec<ConversationId> = pages.concat();
    let unique: HashSet<_> = walked.iter().copied().collect();
    assert_eq!(
        unique.len(),
        walked.len(),
        "a conversation was listed twice"
    );
    assert!(
        existing.is_subset(&unique),
        "a conversation that existed was skipped"
    );
    assert!(unique.is_subset(&existing.union(&created).copied().collect()));
    // Newest first throughout: the walk is the order of a single listing.
    let everything = ids(
        &*store,
        ListFilter {
            limit: 1000,
            ..filter()
        },
    )
    .await?;
    let in_order: Vec<_> = everything
        .into_iter()
        .filter(|id| unique.contains(id))
        .collect();
    assert_eq!(walked, in_order);
    Ok(())
}
