-- Opt-in leases (issue 17): a live owner renews `lease_expires_at` (Unix
-- milliseconds) on a timer with one fenced UPDATE that moves neither the
-- revision nor `updated_at`. NULL: no lease, stuck detection falls back to
-- the activity time.
ALTER TABLE admissions ADD COLUMN lease_expires_at bigint;

-- A lease belongs to one owner, the admission at one revision: every change
-- of owner (claim, recovery claim, commit, abandon, approval decision) bumps
-- the revision and so drops the lease. The new owner takes its own with its
-- first renewal. A trigger, so that no step has to change.
CREATE FUNCTION lease_follows_owner() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.revision <> OLD.revision THEN
        NEW.lease_expires_at := NULL;
    END IF;
    RETURN NEW;
END;
$$;

CREATE TRIGGER lease_follows_owner BEFORE UPDATE OF revision ON admissions
    FOR EACH ROW EXECUTE FUNCTION lease_follows_owner();

-- `expired_leases`: held admissions with a lease, soonest expired first.
CREATE INDEX admissions_leased ON admissions (lease_expires_at)
    WHERE lease_expires_at IS NOT NULL AND active_request_id IS NOT NULL;
