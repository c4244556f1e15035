//! Teams (issue 44): created, changed at runtime, removed only when empty;
//! repositories start in `default` and move between teams.

use super::*;

pub async fn teams_hold_repositories_and_change_at_runtime<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let r = repo(s).await;
    assert_eq!(r.team, DEFAULT_TEAM, "a new repository is in the default team");
    let default = s.get_team(DEFAULT_TEAM).await.unwrap();
    assert_eq!((default.weight, default.max_running), (1, None));

    let web = s.create_team("web", 3, Some(4), Some(100)).await.unwrap();
    assert_eq!((web.weight, web.max_running, web.max_queued, web.repos), (3, Some(4), Some(100), 0));
    assert!(matches!(s.create_team("web", 1, None, None).await, Err(StoreError::Conflict(_))));
    assert!(matches!(s.create_team("bad name", 1, None, None).await, Err(StoreError::Invalid(_))));
    assert!(matches!(s.create_team("zero", 0, None, None).await, Err(StoreError::Invalid(_))));

    s.set_repo_team(&r.id, "web").await.unwrap();
    assert_eq!(s.get_repo(&r.id).await.unwrap().team, "web");
    assert!(matches!(s.set_repo_team(&r.id, "nope").await, Err(StoreError::NotFound(_))));
    assert_eq!(s.get_team("web").await.unwrap().repos, 1);

    // Weight and quotas change in place; `Some(None)` lifts a quota.
    let changed =
        s.update_team("web", &TeamUpdate { weight: Some(5), max_running: Some(None), max_queued: None }).await.unwrap();
    assert_eq!((changed.weight, changed.max_running, changed.max_queued), (5, None, Some(100)));
    assert!(matches!(s.update_team("nope", &TeamUpdate::default()).await, Err(StoreError::NotFound(_))));

    // Only an empty team goes, never `default`.
    assert!(matches!(s.delete_team("web").await, Err(StoreError::Conflict(ref m)) if m.contains("1 repository")));
    s.set_repo_team(&r.id, DEFAULT_TEAM).await.unwrap();
    assert_eq!(s.delete_team("web").await.unwrap().name, "web");
    assert!(matches!(s.delete_team(DEFAULT_TEAM).await, Err(StoreError::Conflict(_))));
    let names: Vec<String> = s.list_teams().await.unwrap().into_iter().map(|t| t.name).collect();
    assert_eq!(names, [DEFAULT_TEAM]);
}

/// The claim transaction charges the job's team (its virtual time moves by
/// `STRIDE / weight`, from at least one stride behind the dispatcher's
/// clock) and holds its running quota, reservations included: a claimed
/// attempt counts from the claim, and of two concurrent claims for the last
/// slot exactly one wins. Outbox events carry the team, lane and ready time.
pub async fn claims_charge_their_team_and_hold_its_running_quota<S: Store + 'static>(o: &Opener<S>) {
    use kiln_core::fair::STRIDE;
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let r = repo(s).await;
    s.create_team("q", 2, Some(1), None).await.unwrap();
    s.set_repo_team(&r.id, "q").await.unwrap();
    let wf = || workflow(vec![job("a", &[], 0)]);
    let mut runs = Vec::new();
    for _ in 0..3 {
        runs.push(s.accept_run(new_run(&r.id, wf())).await.unwrap().run_id);
    }
    let jobs: Vec<String> = {
        let mut v = Vec::new();
        for run in &runs {
            v.push(job_id(s, run, "a").await);
        }
        v
    };
    let ev = pending_for(s, &jobs[0]).await.remove(0);
    assert_eq!((ev.team.as_str(), ev.lane.as_str()), ("q", "normal"));
    assert!((wall_ms() - ev.ready_at_ms).abs() < 60_000, "ready now: {}", ev.ready_at_ms);
    assert_eq!(s.queued_jobs(Some("q")).await.unwrap(), 3);
    assert_eq!(s.queued_jobs(Some(DEFAULT_TEAM)).await.unwrap(), 0);

    let (a1, a2) = (agent(s, "a1", 4).await, agent(s, "a2", 4).await);
    let c = claim(s, &a1, &jobs[0], LONG_TTL).await;
    assert!(c.started, "a new start, to be charged");
    assert_eq!(c.run.team, "q");
    assert_eq!(s.get_team("q").await.unwrap().pass, 0, "the claim itself writes no virtual time");
    let charge = |starts: u64, clock: u64| TeamCharge { team: "q".into(), starts, clock };
    let charged = s.charge_teams(&[charge(1, 0)]).await.unwrap();
    assert_eq!(charged.get("q"), Some(&(STRIDE / 2)), "weight 2: half a stride");
    assert_eq!(s.get_team("q").await.unwrap().pass, STRIDE / 2, "persisted: a restart resumes from it");
    // Charges add up: two replicas writing theirs lose none, and a team
    // gone is skipped.
    let gone = TeamCharge { team: "nobody".into(), starts: 5, clock: 0 };
    let (first, second) = ([charge(2, 0), gone], [charge(1, 0)]);
    let (x, y) = tokio::join!(s.charge_teams(&first), s.charge_teams(&second));
    assert!(!x.unwrap().contains_key("nobody"));
    y.unwrap();
    assert_eq!(s.get_team("q").await.unwrap().pass, 4 * (STRIDE / 2), "3 more starts");
    // The claimed attempt holds the team's one slot, started or not.
    let g = s.get_job(&jobs[1]).await.unwrap().dispatch_generation;
    let over = s.claim_placed(claim_input(&a2, &jobs[1], g, LONG_TTL)).await.unwrap();
    assert!(matches!(over, ClaimOutcome::AtQuota(ref t, 1) if t == "q"), "{over:?}");
    assert_eq!(job_status(s, &jobs[1]).await, JobStatus::Ready, "nothing changed");
    let groups = s.queue_groups().await.unwrap();
    let q: Vec<_> = groups.iter().filter(|g| g.team == "q").collect();
    assert_eq!((q.len(), q[0].ready, q[0].running, q[0].lane.as_str()), (1, 2, 1, "normal"));
    assert!(q[0].oldest_ready_at.is_some());

    // The slot frees with the completion; the two waiting jobs race for it.
    s.complete(&jobs[0], c.epoch, success()).await.unwrap();
    let (g1, g2) = (
        s.get_job(&jobs[1]).await.unwrap().dispatch_generation,
        s.get_job(&jobs[2]).await.unwrap().dispatch_generation,
    );
    // A clock far ahead: an idle team's time moves up to one stride behind it.
    let clock = 10 * STRIDE;
    let (x, y) = tokio::join!(
        s.claim_placed(claim_input(&a1, &jobs[1], g1, LONG_TTL)),
        s.claim_placed(claim_input(&a2, &jobs[2], g2, LONG_TTL)),
    );
    let (x, y) = (x.unwrap(), y.unwrap());
    let won: Vec<&ClaimOutcome> = [&x, &y].into_iter().filter(|o| matches!(o, ClaimOutcome::Claimed(_))).collect();
    assert_eq!(won.len(), 1, "exactly one claim takes the last slot: {x:?} / {y:?}");
    let ClaimOutcome::Claimed(w) = won[0] else { unreachable!() };
    assert!(w.started);
    let charged = s.charge_teams(&[charge(1, clock)]).await.unwrap();
    assert_eq!(charged.get("q"), Some(&(clock - STRIDE / 2 + STRIDE / 2)), "from one stride behind the clock");
    assert!([&x, &y].iter().any(|o| matches!(o, ClaimOutcome::AtQuota(..))));

    // A quota lifted at runtime applies to the next claim.
    s.update_team("q", &TeamUpdate { max_running: Some(None), ..TeamUpdate::default() }).await.unwrap();
    let left = if matches!(x, ClaimOutcome::Claimed(_)) { &jobs[2] } else { &jobs[1] };
    claim(s, &a1, left, LONG_TTL).await;
}

/// An admin moves a run to another lane: its ready jobs get a new dispatch
/// generation and an outbox event carrying the lane, with their ready
/// time kept (aging goes on); a run that ended is refused.
pub async fn a_runs_lane_changes_with_its_ready_jobs<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let (_, run) = start(s, workflow(vec![job("a", &[], 0), job("b", &["a"], 0)])).await;
    assert_eq!(view(s, &run).await.run.priority, "normal");
    let a = job_id(s, &run, "a").await;
    let before = s.get_job(&a).await.unwrap();
    let ready_at = pending_for(s, &a).await[0].ready_at_ms;
    assert_eq!(s.set_run_priority(&run, "urgent").await.unwrap(), 1, "one ready job (b waits on a)");
    let after = s.get_job(&a).await.unwrap();
    assert_eq!(after.dispatch_generation, before.dispatch_generation + 1);
    let evs = pending_for(s, &a).await;
    let new = evs.iter().find(|e| e.dispatch_generation == after.dispatch_generation).expect("a new event");
    assert_eq!((new.lane.as_str(), new.ready_at_ms), ("urgent", ready_at), "its ready time is kept");
    assert_eq!(view(s, &run).await.run.priority, "urgent");
    s.cancel_run(&run).await.unwrap();
    assert!(matches!(s.set_run_priority(&run, "background").await, Err(StoreError::Conflict(_))));
    assert!(matches!(s.set_run_priority("no-such-run", "urgent").await, Err(StoreError::NotFound(_))));
}

/// The store against kiln-core's reference model (issue 44): random teams
/// (weights, running quotas), runs in random lanes, random job lengths on
/// a few slots. Before every start the dispatcher's state is read back
/// from the store alone — the teams' persisted virtual times, what each
/// holds — as a replica that just started (or took over) would, and its
/// decision must be the reference model's, which kept its state in memory
/// all along; the claim transaction must charge the virtual time the model
/// did and never refuse what the model found under quota; no team ever
/// holds more than its quota.
pub async fn fair_share_through_the_store_follows_the_reference_model<S: Store + 'static>(o: &Opener<S>) {
    use kiln_core::fair::{Candidate, Lane, Shares, Team, resumed_clock};
    use rand::{Rng, SeedableRng};
    for seed in 0..3u64 {
        let fx = o.open(FAST).await;
        let s = &*fx.store;
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let slots: usize = rng.random_range(1..=3);
        let mut reference = Shares::default();
        let mut quotas = BTreeMap::new();
        let mut repos = Vec::new();
        for t in 0..3 {
            let name = format!("t{t}");
            let weight = rng.random_range(1..=4u32);
            let quota = if rng.random_bool(0.5) { Some(rng.random_range(1..=2u32)) } else { None };
            s.create_team(&name, weight, quota, None).await.unwrap();
            let r = repo(s).await;
            s.set_repo_team(&r.id, &name).await.unwrap();
            reference.teams.insert(name.clone(), Team { weight, max_running: quota, ..Team::default() });
            quotas.insert(name.clone(), quota);
            repos.push((name, r));
        }
        for (_, r) in &repos {
            for _ in 0..rng.random_range(2..=7) {
                let lane = ["urgent", "normal", "background"][rng.random_range(0..3)];
                let run = NewRun { priority: lane.into(), ..new_run(&r.id, workflow(vec![job("a", &[], 0)])) };
                s.accept_run(run).await.unwrap();
            }
        }
        let agent = agent(s, "a", slots as u32).await;
        let now = wall_ms();
        // (job, epoch, team, the step it ends at)
        let mut running: Vec<(String, i64, String, u32)> = Vec::new();
        let mut starts = 0;
        for step in 0..400u32 {
            let (ending, still): (Vec<_>, Vec<_>) = running.into_iter().partition(|r| r.3 <= step);
            running = still;
            for (job, epoch, team, _) in ending {
                s.complete(&job, epoch, success()).await.unwrap();
                reference.finish(&team);
            }
            while running.len() < slots {
                // The dispatcher's state, from the store alone.
                let mut view = Shares::default();
                for t in s.list_teams().await.unwrap() {
                    let team = Team { weight: t.weight, max_running: t.max_running, running: 0, pass: t.pass };
                    view.teams.insert(t.name, team);
                }
                for g in s.queue_groups().await.unwrap() {
                    if let Some(t) = view.teams.get_mut(&g.team) {
                        t.running += u32::try_from(g.running).unwrap();
                    }
                }
                view.clock = resumed_clock(view.teams.values());
                for (name, t) in &view.teams {
                    if let Some(quota) = t.max_running {
                        assert!(t.running <= quota, "seed {seed}: team {name} holds {} > {quota}", t.running);
                    }
                }
                let mut ready = s.ready_jobs().await.unwrap();
                ready.sort_by(|x, y| (x.ready_at_ms, &x.job_id).cmp(&(y.ready_at_ms, &y.job_id)));
                let cands: Vec<Candidate> = ready
                    .iter()
                    .map(|e| Candidate {
                        team: e.team.clone(),
                        lane: Lane::parse(&e.lane).unwrap(),
                        ready_at_ms: e.ready_at_ms,
                        seq: 0,
                    })
                    .collect();
                let mine = view.choose(&cands, now);
                let model = reference.choose(&cands, now);
                assert_eq!(
                    mine.map(|i| &cands[i].team),
                    model.map(|i| &cands[i].team),
                    "seed {seed} step {step}: the store's state decides as the model does"
                );
                let Some(i) = mine else { break };
                let ev = &ready[i];
                let input = claim_input(&agent, &ev.job_id, ev.dispatch_generation, LONG_TTL);
                let c = match s.claim_placed(input).await.unwrap() {
                    ClaimOutcome::Claimed(c) => c,
                    other => {
                        panic!("seed {seed}: the model found team {} under quota; the store said {other:?}", ev.team)
                    }
                };
                reference.start(&ev.team, 1);
                // The dispatcher writes the start (here at once; a server
                // once a second, which the refresh adds back).
                let charged = s
                    .charge_teams(&[TeamCharge { team: ev.team.clone(), starts: 1, clock: view.clock }])
                    .await
                    .unwrap();
                assert!(c.started);
                assert_eq!(
                    charged.get(&ev.team),
                    Some(&reference.team(&ev.team).pass),
                    "seed {seed}: the charged virtual time"
                );
                running.push((ev.job_id.clone(), c.epoch, ev.team.clone(), step + rng.random_range(1..=3)));
                starts += 1;
            }
            if running.is_empty() && s.ready_jobs().await.unwrap().is_empty() {
                break;
            }
        }
        assert!(s.ready_jobs().await.unwrap().is_empty() && running.is_empty(), "seed {seed}: every job ran");
        assert!(starts >= 6, "seed {seed}: {starts} starts");
    }
}
