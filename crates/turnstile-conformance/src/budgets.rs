//! A request's budget is stored with its claim and read back by every read
//! of the request; a recovery claim that changes it records the change on
//! its new run, and the request takes the new budget.

use turnstile_core::store::{BudgetChange, RecoveryClaim};
use turnstile_core::{Budget, Revision};

use crate::support::*;

fn budget(max_turns: u32) -> Budget {
    Budget {
        max_turns: Some(max_turns),
        max_tokens: Some(u64::MAX),
        max_tool_calls: None,
    }
}

pub async fn claim_stores_the_budget_and_every_read_of_the_request_returns_it(
    store: SharedStore,
) -> TestResult {
    let conversation = new_conversation(&*store).await?;
    let mut claim = new_request(conversation, Revision(0), "within limits");
    claim.budget = budget(3);
    store.claim(&claim).await?;
    let record = store.request(claim.request_id).await?.expect("request");
    assert_eq!(record.budget, budget(3), "u64::MAX tokens round-trip too");
    let context = store
        .claim_context(&ns(), conversation, claim.request_id, None)
        .await?;
    assert_eq!(context.request.map(|r| r.budget), Some(budget(3)));

    let other = new_conversation(&*store).await?;
    let plain = new_request(other, Revision(0), "no limits");
    store.claim(&plain).await?;
    let record = store.request(plain.request_id).await?.expect("request");
    assert!(record.budget.is_unlimited());
    Ok(())
}

pub async fn recovery_claim_with_a_budget_change_records_it_and_the_request_keeps_it(
    store: SharedStore,
) -> TestResult {
    let conversation = new_conversation(&*store).await?;
    let mut claim = new_request(conversation, Revision(0), "raise me");
    claim.budget = budget(1);
    let first = match store.claim(&claim).await? {
        turnstile_core::store::ClaimOutcome::Admitted(fence) => fence,
        other => panic!("expected admission, got {other:?}"),
    };
    let change = BudgetChange {
        from: budget(1),
        to: budget(5),
    };
    let raised = store
        .claim_recovery(&RecoveryClaim {
            budget_change: Some(change),
            ..recovery_of(&first)
        })
        .await?;
    let run = store.run(raised.run_id).await?.expect("new run");
    assert_eq!(run.budget_change, Some(change));
    assert_eq!(
        store.run(first.run_id).await?.expect("old").budget_change,
        None
    );
    let record = store.request(first.request_id).await?.expect("request");
    assert_eq!(record.budget, budget(5));

    // A plain recovery keeps the raised budget and records no change.
    let plain = recover(&*store, &raised).await?;
    assert_eq!(
        store.run(plain.run_id).await?.expect("run").budget_change,
        None
    );
    let record = store.request(first.request_id).await?.expect("request");
    assert_eq!(record.budget, budget(5));

    // A refused recovery claim (a stale revision) changes nothing.
    let stale = store
        .claim_recovery(&RecoveryClaim {
            expected_revision: raised.revision,
            budget_change: Some(BudgetChange {
                from: budget(5),
                to: budget(9),
            }),
            ..recovery_of(&plain)
        })
        .await;
    assert!(stale.is_err(), "{stale:?}");
    let record = store.request(first.request_id).await?.expect("request");
    assert_eq!(record.budget, budget(5));
    Ok(())
}
