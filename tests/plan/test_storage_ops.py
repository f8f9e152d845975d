"""What a run asks of Cloud Storage while it runs (runner.plan.storage_ops): the hosts' writes grow with the slice,
the runner's listings do not, and the plan of a multi-host job says what that costs beside the slice."""

from __future__ import annotations

from runner.plan import storage_ops


def test_the_hosts_writes_grow_with_the_slice_and_the_runner_s_listings_do_not() -> None:
    one, big = storage_ops.estimate(1), storage_ops.estimate(256)
    assert big.runner_class_a == one.runner_class_a == storage_ops.LISTINGS / storage_ops.POLL_S
    # each host: a part upload and a compose every sync, a heartbeat every beat (worker 0 also the run's)
    per_host = 2 / storage_ops.SYNC_S + 1 / storage_ops.HEARTBEAT_S
    assert big.hosts_class_a == 256 * per_host + 1 / storage_ops.HEARTBEAT_S
    assert big.hosts_free == 256 / storage_ops.SYNC_S  # the composed parts' deletes
    assert big.per_s == big.hosts_per_s + big.runner_class_a + big.runner_class_b


def test_the_cost_is_class_a_and_class_b_operations_at_their_list_prices() -> None:
    ops = storage_ops.StorageOps(hosts_class_a=1.0, hosts_free=50.0, runner_class_a=1.0, runner_class_b=10.0)
    hourly = 2 * 3.6 * storage_ops.CLASS_A_PER_1000 + 10 * 3.6 * storage_ops.CLASS_B_PER_1000
    assert abs(ops.per_hour_usd - hourly) < 1e-12  # deletes are free


def test_the_plan_row_sets_the_cost_beside_the_slice_s_price() -> None:
    key, text = storage_ops.plan_row(256, 4300.80)
    ops = storage_ops.estimate(256)
    assert key == "storage ops"
    assert f"about {ops.per_s:,.0f} requests/s" in text and "from the 256 hosts" in text
    assert f"${ops.per_hour_usd:,.2f}/hour beside the slice's $4,300.80/hour" in text
    assert storage_ops.PRICES_READ_ON in text
    assert "beside" not in storage_ops.plan_row(4, None)[1]  # no price in the catalog: nothing to set it beside
