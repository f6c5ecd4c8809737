-- The current schema of a turnstile PostgreSQL database, as pg_dump writes a
-- freshly migrated one (written by the test `schema_sql`; do not edit by hand).
-- Migrations under migrations/ change it.
--
-- PostgreSQL database dump
--



SET statement_timeout = 0;
SET lock_timeout = 0;
SET idle_in_transaction_session_timeout = 0;
SET client_encoding = 'UTF8';
SET standard_conforming_strings = on;
SELECT pg_catalog.set_config('search_path', '', false);
SET check_function_bodies = false;
SET xmloption = content;
SET client_min_messages = warning;
SET row_security = off;

--
-- Name: event_answered(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.event_answered() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
DECLARE
    stepped_at bigint;
BEGIN
    -- The time the step's fence wrote, on the clock of every other event.
    SELECT a.updated_at INTO stepped_at
    FROM admissions a JOIN conversations c USING (conversation_id)
    WHERE a.conversation_id = NEW.conversation_id AND a.active_request_id = NEW.request_id
      AND NEW.seq > c.transcript_length;
    IF FOUND THEN
        PERFORM log_event(NEW.conversation_id, 2::smallint, NEW.request_id, NULL,
            NULL, NEW.seq, NULL, stepped_at);
    END IF;
    RETURN NULL;
END $$;


--
-- Name: event_approval_decided(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.event_approval_decided() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM log_event(NEW.conversation_id, 5::smallint, NEW.request_id, NULL, NEW.turn,
        NULL,
        (SELECT call_id FROM tool_calls
         WHERE conversation_id = NEW.conversation_id AND request_id = NEW.request_id
           AND turn = NEW.turn AND position = NEW.position),
        COALESCE(NEW.decided_at, event_clock()));
    RETURN NULL;
END $$;


--
-- Name: event_approval_requested(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.event_approval_requested() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM log_event(NEW.conversation_id, 4::smallint, NEW.request_id, NULL, NEW.turn,
        NULL,
        (SELECT call_id FROM tool_calls
         WHERE conversation_id = NEW.conversation_id AND request_id = NEW.request_id
           AND turn = NEW.turn AND position = NEW.position),
        NEW.requested_at);
    RETURN NULL;
END $$;


--
-- Name: event_checkpoint_saved(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.event_checkpoint_saved() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM log_event(NEW.conversation_id, 9::smallint,
        (SELECT request_id FROM runs
         WHERE conversation_id = NEW.conversation_id AND run_id = NEW.run_id),
        NEW.run_id, NEW.turn, NULL, NULL, NEW.created_at);
    RETURN NULL;
END $$;


--
-- Name: event_clock(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.event_clock() RETURNS bigint
    LANGUAGE sql
    AS $$
    SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint
$$;


--
-- Name: event_first_run_stopped(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.event_first_run_stopped() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM log_event(NEW.conversation_id, 6::smallint, NEW.request_id, NEW.request_id,
        NULL, NULL, NULL, COALESCE(NEW.run_ended_at, event_clock()));
    RETURN NULL;
END $$;


--
-- Name: event_run_started(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.event_run_started() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM log_event(NEW.conversation_id, 1::smallint, NEW.request_id, NEW.run_id,
        NULL, NULL, NULL, NEW.started_at);
    RETURN NULL;
END $$;


--
-- Name: event_run_stopped(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.event_run_stopped() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM log_event(NEW.conversation_id, 6::smallint, NEW.request_id, NEW.run_id,
        NULL, NULL, NULL, COALESCE(NEW.ended_at, event_clock()));
    RETURN NULL;
END $$;


--
-- Name: event_tool_finished(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.event_tool_finished() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM log_event(NEW.conversation_id, 3::smallint, NEW.request_id, NULL,
        NEW.turn, NULL, NEW.call_id, COALESCE(NEW.completed_at, event_clock()));
    RETURN NULL;
END $$;


--
-- Name: lease_follows_owner(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.lease_follows_owner() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF NEW.revision <> OLD.revision THEN
        NEW.lease_expires_at := NULL;
    END IF;
    RETURN NEW;
END;
$$;


--
-- Name: log_event(uuid, smallint, uuid, uuid, bigint, bigint, bytea, bigint); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.log_event(uuid, smallint, uuid, uuid, bigint, bigint, bytea, bigint) RETURNS void
    LANGUAGE plpgsql
    AS $_$
BEGIN
    WITH counted AS (
        UPDATE admissions SET event_seq = event_seq + 1 WHERE conversation_id = $1
        RETURNING event_seq
    )
    INSERT INTO events (conversation_id, seq, kind, request_id, run_id, turn, entry_seq,
        call_id, at)
    SELECT $1, event_seq, $2, $3, NULLIF($4, $3), $5, $6, $7, $8 FROM counted;
END $_$;


--
-- Name: turnstile_drop_blobs(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.turnstile_drop_blobs() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
DECLARE
    parts text := to_jsonb(OLD) ->> TG_ARGV[0];
BEGIN
    UPDATE blobs SET refs = blobs.refs - named.n
    FROM (SELECT hit[1] AS sha256, count(*) AS n
          FROM regexp_matches(parts, '"sha256":"([0-9a-f]{64})"', 'g') AS hit
          GROUP BY 1) AS named
    WHERE blobs.sha256 = named.sha256;
    DELETE FROM blobs
    WHERE refs <= 0
      AND sha256 IN (SELECT hit[1]
                     FROM regexp_matches(parts, '"sha256":"([0-9a-f]{64})"', 'g') AS hit);
    RETURN NULL;
END
$$;


--
-- Name: turnstile_refuse_deleted_conversation(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.turnstile_refuse_deleted_conversation() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM deleted_conversations WHERE conversation_id = NEW.conversation_id) THEN
        RAISE EXCEPTION 'turnstile: deleted' USING ERRCODE = 'P0001';
    END IF;
    RETURN NULL;
END
$$;


--
-- Name: turnstile_row_moved(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.turnstile_row_moved() RETURNS boolean
    LANGUAGE plpgsql
    AS $$
BEGIN
    RAISE EXCEPTION 'turnstile: a run''s row changed while this step waited for its lock'
        USING ERRCODE = 'serialization_failure';
END $$;


--
-- Name: turnstile_take_blobs(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.turnstile_take_blobs() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
DECLARE
    missing text;
    parts text := to_jsonb(NEW) ->> TG_ARGV[0];
BEGIN
    WITH named AS (
        SELECT hit[1] AS sha256, count(*) AS n
        FROM regexp_matches(parts, '"sha256":"([0-9a-f]{64})"', 'g') AS hit
        GROUP BY 1
    ), taken AS (
        UPDATE blobs SET refs = blobs.refs + named.n FROM named
        WHERE blobs.sha256 = named.sha256
        RETURNING blobs.sha256
    )
    SELECT named.sha256 INTO missing FROM named
    WHERE named.sha256 NOT IN (SELECT sha256 FROM taken) LIMIT 1;
    IF missing IS NOT NULL THEN
        RAISE EXCEPTION 'turnstile: blob missing' USING ERRCODE = 'P0001';
    END IF;
    RETURN NULL;
END
$$;


SET default_tablespace = '';

SET default_table_access_method = heap;

--
-- Name: admissions; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.admissions (
    conversation_id uuid NOT NULL,
    revision bigint NOT NULL,
    active_request_id uuid,
    input_sha256 bytea,
    run_id uuid,
    agent_fingerprint text,
    input_tokens bigint DEFAULT 0 NOT NULL,
    output_tokens bigint DEFAULT 0 NOT NULL,
    cache_read_tokens bigint DEFAULT 0 NOT NULL,
    cache_write_tokens bigint DEFAULT 0 NOT NULL,
    summary_passes bigint DEFAULT 0 NOT NULL,
    summary_from_seq bigint,
    summary_through_seq bigint,
    summary_version bigint,
    summary_prompt_sha256 bytea,
    updated_at bigint NOT NULL,
    lease_expires_at bigint,
    event_seq bigint DEFAULT 0 NOT NULL
);


--
-- Name: first_run_checkpoints; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.first_run_checkpoints (
    conversation_id uuid NOT NULL,
    request_id uuid NOT NULL,
    turn bigint NOT NULL,
    phase text NOT NULL,
    input_tokens bigint NOT NULL,
    output_tokens bigint NOT NULL,
    cache_read_tokens bigint NOT NULL,
    cache_write_tokens bigint NOT NULL,
    tool_calls_count bigint NOT NULL,
    reports_count bigint NOT NULL,
    message_count bigint NOT NULL,
    created_at bigint NOT NULL
);


--
-- Name: loop_checkpoints; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.loop_checkpoints (
    conversation_id uuid NOT NULL,
    run_id uuid NOT NULL,
    turn bigint NOT NULL,
    phase text NOT NULL,
    input_tokens bigint NOT NULL,
    output_tokens bigint NOT NULL,
    cache_read_tokens bigint NOT NULL,
    cache_write_tokens bigint NOT NULL,
    tool_calls_count bigint NOT NULL,
    reports_count bigint NOT NULL,
    message_count bigint NOT NULL,
    created_at bigint NOT NULL
);


--
-- Name: requests; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.requests (
    conversation_id uuid NOT NULL,
    request_id uuid NOT NULL,
    input_sha256 bytea NOT NULL,
    status text NOT NULL,
    committed_run_id uuid,
    conversation_version bigint,
    first_seq bigint,
    end_seq bigint,
    created_at bigint NOT NULL,
    completed_at bigint,
    abandoned_by uuid,
    deadline_at bigint,
    budget jsonb,
    run_status text,
    run_error bytea,
    run_ended_at bigint,
    turn bigint,
    phase text,
    input_tokens bigint,
    output_tokens bigint,
    cache_read_tokens bigint,
    cache_write_tokens bigint,
    tool_calls_count bigint,
    reports_count bigint,
    message_count bigint,
    checkpoint_at bigint,
    admitted_event bigint,
    admitted_entry bigint,
    admitted_run_id uuid,
    settled_event bigint,
    CONSTRAINT requests_run_status_check CHECK ((run_status = ANY (ARRAY['running'::text, 'completed'::text, 'failed'::text, 'superseded'::text, 'abandoned'::text]))),
    CONSTRAINT requests_status_check CHECK ((status = ANY (ARRAY['active'::text, 'completed'::text, 'abandoned'::text])))
);


--
-- Name: all_checkpoints; Type: VIEW; Schema: public; Owner: -
--

CREATE VIEW public.all_checkpoints AS
 SELECT requests.conversation_id,
    requests.request_id AS run_id,
    requests.turn,
    requests.phase,
    requests.input_tokens,
    requests.output_tokens,
    requests.cache_read_tokens,
    requests.cache_write_tokens,
    requests.tool_calls_count,
    requests.reports_count,
    requests.message_count,
    requests.checkpoint_at AS created_at
   FROM public.requests
  WHERE (requests.phase IS NOT NULL)
UNION ALL
 SELECT first_run_checkpoints.conversation_id,
    first_run_checkpoints.request_id AS run_id,
    first_run_checkpoints.turn,
    first_run_checkpoints.phase,
    first_run_checkpoints.input_tokens,
    first_run_checkpoints.output_tokens,
    first_run_checkpoints.cache_read_tokens,
    first_run_checkpoints.cache_write_tokens,
    first_run_checkpoints.tool_calls_count,
    first_run_checkpoints.reports_count,
    first_run_checkpoints.message_count,
    first_run_checkpoints.created_at
   FROM public.first_run_checkpoints
UNION ALL
 SELECT loop_checkpoints.conversation_id,
    loop_checkpoints.run_id,
    loop_checkpoints.turn,
    loop_checkpoints.phase,
    loop_checkpoints.input_tokens,
    loop_checkpoints.output_tokens,
    loop_checkpoints.cache_read_tokens,
    loop_checkpoints.cache_write_tokens,
    loop_checkpoints.tool_calls_count,
    loop_checkpoints.reports_count,
    loop_checkpoints.message_count,
    loop_checkpoints.created_at
   FROM public.loop_checkpoints;


--
-- Name: request_ids; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.request_ids (
    request_id uuid NOT NULL,
    conversation_id uuid NOT NULL
);


--
-- Name: runs; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.runs (
    conversation_id uuid NOT NULL,
    run_id uuid NOT NULL,
    request_id uuid NOT NULL,
    resumed_from uuid,
    status text NOT NULL,
    error bytea,
    started_at bigint NOT NULL,
    ended_at bigint,
    agent_fingerprint text,
    replaced_fingerprint text,
    budget_change jsonb,
    CONSTRAINT runs_status_check CHECK ((status = ANY (ARRAY['running'::text, 'completed'::text, 'failed'::text, 'superseded'::text, 'abandoned'::text])))
);


--
-- Name: all_runs; Type: VIEW; Schema: public; Owner: -
--

CREATE VIEW public.all_runs AS
 SELECT k.conversation_id,
    k.request_id AS run_id,
    k.request_id,
    NULL::uuid AS resumed_from,
    q.run_status AS status,
    q.run_error AS error,
    q.created_at AS started_at,
    q.run_ended_at AS ended_at,
    NULL::text AS agent_fingerprint,
    NULL::text AS replaced_fingerprint,
    NULL::jsonb AS budget_change
   FROM (public.request_ids k
     JOIN public.requests q ON (((q.conversation_id = k.conversation_id) AND (q.request_id = k.request_id))))
  WHERE (q.run_status IS NOT NULL)
UNION ALL
 SELECT runs.conversation_id,
    runs.run_id,
    runs.request_id,
    runs.resumed_from,
    runs.status,
    runs.error,
    runs.started_at,
    runs.ended_at,
    runs.agent_fingerprint,
    runs.replaced_fingerprint,
    runs.budget_change
   FROM public.runs;


--
-- Name: approvals; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.approvals (
    conversation_id uuid NOT NULL,
    request_id uuid NOT NULL,
    turn bigint NOT NULL,
    "position" bigint NOT NULL,
    run_id uuid NOT NULL,
    status text NOT NULL,
    reason bytea,
    requested_at bigint NOT NULL,
    decided_at bigint,
    decided_by uuid,
    decided_revision bigint,
    CONSTRAINT approvals_status_check CHECK ((status = ANY (ARRAY['awaiting'::text, 'approved'::text, 'rejected'::text])))
);


--
-- Name: blob_bytes; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.blob_bytes (
    blob bigint NOT NULL,
    chunk integer NOT NULL,
    bytes bytea NOT NULL
);
ALTER TABLE ONLY public.blob_bytes ALTER COLUMN bytes SET STORAGE PLAIN;


--
-- Name: blobs; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.blobs (
    sha256 text NOT NULL,
    id bigint NOT NULL,
    size bigint NOT NULL,
    refs bigint DEFAULT 0 NOT NULL
);


--
-- Name: blobs_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

ALTER TABLE public.blobs ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.blobs_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: conversations; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.conversations (
    conversation_id uuid NOT NULL,
    namespace text NOT NULL,
    version bigint DEFAULT 0 NOT NULL,
    created_at bigint NOT NULL,
    title text,
    owner text,
    metadata jsonb DEFAULT '{}'::jsonb NOT NULL,
    meta_version bigint DEFAULT 0 NOT NULL,
    meta_updated_at bigint,
    meta_updated_by uuid,
    transcript_length bigint DEFAULT 0 NOT NULL
);


--
-- Name: deleted_conversations; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.deleted_conversations (
    conversation_id uuid NOT NULL,
    namespace text NOT NULL,
    deleted_at bigint NOT NULL,
    deleted_by uuid NOT NULL,
    counts bigint[] NOT NULL
);


--
-- Name: deleted_runs; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.deleted_runs (
    conversation_id uuid NOT NULL,
    run_id uuid NOT NULL
);


--
-- Name: events; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.events (
    conversation_id uuid NOT NULL,
    seq bigint NOT NULL,
    kind smallint NOT NULL,
    request_id uuid NOT NULL,
    run_id uuid,
    turn bigint,
    entry_seq bigint,
    call_id bytea,
    at bigint NOT NULL,
    CONSTRAINT events_kind_check CHECK (((kind >= 0) AND (kind <= 9)))
);


--
-- Name: run_messages; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.run_messages (
    conversation_id uuid NOT NULL,
    request_id uuid NOT NULL,
    seq bigint NOT NULL,
    role text NOT NULL,
    content bytea NOT NULL,
    meta text
);


--
-- Name: summaries; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.summaries (
    conversation_id uuid NOT NULL,
    through_seq bigint NOT NULL,
    id bigint NOT NULL,
    from_seq bigint NOT NULL,
    content bytea NOT NULL,
    made_from_version bigint NOT NULL,
    request_id uuid NOT NULL,
    input_tokens bigint NOT NULL,
    output_tokens bigint NOT NULL,
    cache_read_tokens bigint NOT NULL,
    cache_write_tokens bigint NOT NULL,
    created_at bigint NOT NULL
);


--
-- Name: summaries_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

ALTER TABLE public.summaries ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.summaries_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: tokens; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.tokens (
    id uuid NOT NULL,
    namespace text NOT NULL,
    sha256 bytea NOT NULL,
    created_at bigint NOT NULL,
    revoked_at bigint
);


--
-- Name: tool_calls; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.tool_calls (
    conversation_id uuid NOT NULL,
    request_id uuid NOT NULL,
    turn bigint NOT NULL,
    call_id bytea NOT NULL,
    "position" bigint NOT NULL,
    run_id uuid NOT NULL,
    name bytea NOT NULL,
    arguments bytea,
    status text NOT NULL,
    result bytea,
    created_at bigint NOT NULL,
    completed_at bigint,
    result_parts text,
    CONSTRAINT tool_calls_status_check CHECK ((status = ANY (ARRAY['requested'::text, 'completed'::text, 'failed'::text])))
);


--
-- Name: transcript; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.transcript (
    conversation_id uuid NOT NULL,
    seq bigint NOT NULL,
    request_id uuid NOT NULL,
    role text NOT NULL,
    content bytea NOT NULL,
    meta text
);


--
-- Name: verification_reports; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.verification_reports (
    conversation_id uuid NOT NULL,
    request_id uuid NOT NULL,
    seq bigint NOT NULL,
    turn bigint NOT NULL,
    passed boolean NOT NULL,
    detail bytea NOT NULL
);


--
-- Name: admissions admissions_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.admissions
    ADD CONSTRAINT admissions_pkey PRIMARY KEY (conversation_id);


--
-- Name: approvals approvals_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.approvals
    ADD CONSTRAINT approvals_pkey PRIMARY KEY (conversation_id, request_id, turn, "position");


--
-- Name: blob_bytes blob_bytes_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.blob_bytes
    ADD CONSTRAINT blob_bytes_pkey PRIMARY KEY (blob, chunk);


--
-- Name: blobs blobs_id_key; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.blobs
    ADD CONSTRAINT blobs_id_key UNIQUE (id);


--
-- Name: blobs blobs_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.blobs
    ADD CONSTRAINT blobs_pkey PRIMARY KEY (sha256);


--
-- Name: conversations conversations_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.conversations
    ADD CONSTRAINT conversations_pkey PRIMARY KEY (conversation_id);


--
-- Name: deleted_conversations deleted_conversations_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.deleted_conversations
    ADD CONSTRAINT deleted_conversations_pkey PRIMARY KEY (conversation_id);


--
-- Name: deleted_runs deleted_runs_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.deleted_runs
    ADD CONSTRAINT deleted_runs_pkey PRIMARY KEY (conversation_id, run_id);


--
-- Name: events events_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.events
    ADD CONSTRAINT events_pkey PRIMARY KEY (conversation_id, seq);


--
-- Name: first_run_checkpoints first_run_checkpoints_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.first_run_checkpoints
    ADD CONSTRAINT first_run_checkpoints_pkey PRIMARY KEY (conversation_id, request_id, turn);


--
-- Name: loop_checkpoints loop_checkpoints_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.loop_checkpoints
    ADD CONSTRAINT loop_checkpoints_pkey PRIMARY KEY (conversation_id, run_id, turn);


--
-- Name: request_ids request_ids_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.request_ids
    ADD CONSTRAINT request_ids_pkey PRIMARY KEY (request_id);


--
-- Name: requests requests_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.requests
    ADD CONSTRAINT requests_pkey PRIMARY KEY (conversation_id, request_id);


--
-- Name: run_messages run_messages_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.run_messages
    ADD CONSTRAINT run_messages_pkey PRIMARY KEY (conversation_id, request_id, seq);


--
-- Name: runs runs_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.runs
    ADD CONSTRAINT runs_pkey PRIMARY KEY (conversation_id, run_id);


--
-- Name: summaries summaries_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.summaries
    ADD CONSTRAINT summaries_pkey PRIMARY KEY (conversation_id, through_seq);


--
-- Name: tokens tokens_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.tokens
    ADD CONSTRAINT tokens_pkey PRIMARY KEY (id);


--
-- Name: tokens tokens_sha256_key; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.tokens
    ADD CONSTRAINT tokens_sha256_key UNIQUE (sha256);


--
-- Name: tool_calls tool_calls_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.tool_calls
    ADD CONSTRAINT tool_calls_pkey PRIMARY KEY (conversation_id, request_id, turn, "position");


--
-- Name: transcript transcript_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.transcript
    ADD CONSTRAINT transcript_pkey PRIMARY KEY (conversation_id, seq);


--
-- Name: verification_reports verification_reports_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.verification_reports
    ADD CONSTRAINT verification_reports_pkey PRIMARY KEY (conversation_id, request_id, seq);


--
-- Name: admissions_leased; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX admissions_leased ON public.admissions USING btree (lease_expires_at) WHERE (lease_expires_at IS NOT NULL);


--
-- Name: approvals_awaiting; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX approvals_awaiting ON public.approvals USING btree (requested_at) WHERE (status = 'awaiting'::text);


--
-- Name: conversations_by_namespace; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX conversations_by_namespace ON public.conversations USING btree (namespace, created_at);


--
-- Name: conversations_newest; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX conversations_newest ON public.conversations USING btree (created_at, conversation_id);


--
-- Name: deleted_runs_by_run_id; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX deleted_runs_by_run_id ON public.deleted_runs USING btree (run_id);


--
-- Name: request_ids_by_conversation; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX request_ids_by_conversation ON public.request_ids USING btree (conversation_id);


--
-- Name: requests_by_conversation; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX requests_by_conversation ON public.requests USING btree (conversation_id, admitted_event, created_at);


--
-- Name: requests_by_created; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX requests_by_created ON public.requests USING btree (created_at);


--
-- Name: runs_by_request; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX runs_by_request ON public.runs USING btree (conversation_id, request_id);


--
-- Name: runs_by_run_id; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX runs_by_run_id ON public.runs USING btree (run_id);


--
-- Name: tool_calls_by_call_id; Type: INDEX; Schema: public; Owner: -
--

CREATE UNIQUE INDEX tool_calls_by_call_id ON public.tool_calls USING btree (conversation_id, request_id, turn, sha256(call_id));


--
-- Name: conversations conversation_not_deleted; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER conversation_not_deleted AFTER INSERT ON public.conversations FOR EACH ROW EXECUTE FUNCTION public.turnstile_refuse_deleted_conversation();


--
-- Name: transcript event_answered; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER event_answered AFTER INSERT ON public.transcript FOR EACH ROW WHEN ((new.role = 'assistant'::text)) EXECUTE FUNCTION public.event_answered();


--
-- Name: approvals event_approval_decided; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER event_approval_decided AFTER UPDATE OF status ON public.approvals FOR EACH ROW WHEN (((old.status = 'awaiting'::text) AND (new.status <> 'awaiting'::text))) EXECUTE FUNCTION public.event_approval_decided();


--
-- Name: approvals event_approval_requested; Type: TRIGGER; Schema: public; Owner: -
--

CREATE CONSTRAINT TRIGGER event_approval_requested AFTER INSERT ON public.approvals DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION public.event_approval_requested();


--
-- Name: loop_checkpoints event_checkpoint_saved; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER event_checkpoint_saved AFTER UPDATE OF phase ON public.loop_checkpoints FOR EACH ROW WHEN (((new.phase = 'ready'::text) AND (old.phase <> 'ready'::text))) EXECUTE FUNCTION public.event_checkpoint_saved();


--
-- Name: requests event_first_run_stopped; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER event_first_run_stopped AFTER UPDATE OF run_status ON public.requests FOR EACH ROW WHEN (((new.run_status = 'failed'::text) AND (old.run_status <> 'failed'::text))) EXECUTE FUNCTION public.event_first_run_stopped();


--
-- Name: runs event_run_started; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER event_run_started AFTER INSERT ON public.runs FOR EACH ROW WHEN ((new.resumed_from IS NOT NULL)) EXECUTE FUNCTION public.event_run_started();


--
-- Name: runs event_run_stopped; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER event_run_stopped AFTER UPDATE OF status ON public.runs FOR EACH ROW WHEN (((new.status = 'failed'::text) AND (old.status <> 'failed'::text))) EXECUTE FUNCTION public.event_run_stopped();


--
-- Name: tool_calls event_tool_finished; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER event_tool_finished AFTER UPDATE OF status ON public.tool_calls FOR EACH ROW WHEN (((old.status = 'requested'::text) AND (new.status <> 'requested'::text))) EXECUTE FUNCTION public.event_tool_finished();


--
-- Name: admissions lease_follows_owner; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER lease_follows_owner BEFORE UPDATE OF revision ON public.admissions FOR EACH ROW EXECUTE FUNCTION public.lease_follows_owner();


--
-- Name: run_messages run_message_drops_blobs; Type: TRIGGER; Schema: public; Owner: -
--

CREATE CONSTRAINT TRIGGER run_message_drops_blobs AFTER DELETE ON public.run_messages DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN ((strpos(old.meta, '"sha256":"'::text) > 0)) EXECUTE FUNCTION public.turnstile_drop_blobs('meta');


--
-- Name: run_messages run_message_takes_blobs; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER run_message_takes_blobs AFTER INSERT ON public.run_messages FOR EACH ROW WHEN ((strpos(new.meta, '"sha256":"'::text) > 0)) EXECUTE FUNCTION public.turnstile_take_blobs('meta');


--
-- Name: tool_calls tool_call_drops_blobs; Type: TRIGGER; Schema: public; Owner: -
--

CREATE CONSTRAINT TRIGGER tool_call_drops_blobs AFTER DELETE ON public.tool_calls DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN ((strpos(old.result_parts, '"sha256":"'::text) > 0)) EXECUTE FUNCTION public.turnstile_drop_blobs('result_parts');


--
-- Name: tool_calls tool_result_drops_blobs; Type: TRIGGER; Schema: public; Owner: -
--

CREATE CONSTRAINT TRIGGER tool_result_drops_blobs AFTER UPDATE OF result_parts ON public.tool_calls DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN ((strpos(old.result_parts, '"sha256":"'::text) > 0)) EXECUTE FUNCTION public.turnstile_drop_blobs('result_parts');


--
-- Name: tool_calls tool_result_takes_blobs; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER tool_result_takes_blobs AFTER UPDATE OF result_parts ON public.tool_calls FOR EACH ROW WHEN ((strpos(new.result_parts, '"sha256":"'::text) > 0)) EXECUTE FUNCTION public.turnstile_take_blobs('result_parts');


--
-- Name: transcript transcript_drops_blobs; Type: TRIGGER; Schema: public; Owner: -
--

CREATE CONSTRAINT TRIGGER transcript_drops_blobs AFTER DELETE ON public.transcript DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN ((strpos(old.meta, '"sha256":"'::text) > 0)) EXECUTE FUNCTION public.turnstile_drop_blobs('meta');


--
-- Name: transcript transcript_takes_blobs; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER transcript_takes_blobs AFTER INSERT ON public.transcript FOR EACH ROW WHEN ((strpos(new.meta, '"sha256":"'::text) > 0)) EXECUTE FUNCTION public.turnstile_take_blobs('meta');


--
-- Name: admissions admissions_conversation_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.admissions
    ADD CONSTRAINT admissions_conversation_id_fkey FOREIGN KEY (conversation_id) REFERENCES public.conversations(conversation_id) ON DELETE CASCADE;


--
-- Name: approvals approvals_conversation_id_request_id_turn_position_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.approvals
    ADD CONSTRAINT approvals_conversation_id_request_id_turn_position_fkey FOREIGN KEY (conversation_id, request_id, turn, "position") REFERENCES public.tool_calls(conversation_id, request_id, turn, "position") ON DELETE CASCADE;


--
-- Name: blob_bytes blob_bytes_blob_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.blob_bytes
    ADD CONSTRAINT blob_bytes_blob_fkey FOREIGN KEY (blob) REFERENCES public.blobs(id) ON DELETE CASCADE;


--
-- Name: events events_conversation_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.events
    ADD CONSTRAINT events_conversation_id_fkey FOREIGN KEY (conversation_id) REFERENCES public.conversations(conversation_id) ON DELETE CASCADE;


--
-- Name: first_run_checkpoints first_run_checkpoints_conversation_id_request_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.first_run_checkpoints
    ADD CONSTRAINT first_run_checkpoints_conversation_id_request_id_fkey FOREIGN KEY (conversation_id, request_id) REFERENCES public.requests(conversation_id, request_id) ON DELETE CASCADE;


--
-- Name: loop_checkpoints loop_checkpoints_conversation_id_run_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.loop_checkpoints
    ADD CONSTRAINT loop_checkpoints_conversation_id_run_id_fkey FOREIGN KEY (conversation_id, run_id) REFERENCES public.runs(conversation_id, run_id) ON DELETE CASCADE;


--
-- Name: requests requests_conversation_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.requests
    ADD CONSTRAINT requests_conversation_id_fkey FOREIGN KEY (conversation_id) REFERENCES public.conversations(conversation_id) ON DELETE CASCADE;


--
-- Name: run_messages run_messages_conversation_id_request_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.run_messages
    ADD CONSTRAINT run_messages_conversation_id_request_id_fkey FOREIGN KEY (conversation_id, request_id) REFERENCES public.requests(conversation_id, request_id) ON DELETE CASCADE;


--
-- Name: runs runs_conversation_id_request_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.runs
    ADD CONSTRAINT runs_conversation_id_request_id_fkey FOREIGN KEY (conversation_id, request_id) REFERENCES public.requests(conversation_id, request_id) ON DELETE CASCADE;


--
-- Name: summaries summaries_conversation_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.summaries
    ADD CONSTRAINT summaries_conversation_id_fkey FOREIGN KEY (conversation_id) REFERENCES public.conversations(conversation_id) ON DELETE CASCADE;


--
-- Name: tool_calls tool_calls_conversation_id_request_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.tool_calls
    ADD CONSTRAINT tool_calls_conversation_id_request_id_fkey FOREIGN KEY (conversation_id, request_id) REFERENCES public.requests(conversation_id, request_id) ON DELETE CASCADE;


--
-- Name: transcript transcript_conversation_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.transcript
    ADD CONSTRAINT transcript_conversation_id_fkey FOREIGN KEY (conversation_id) REFERENCES public.conversations(conversation_id) ON DELETE CASCADE;


--
-- Name: verification_reports verification_reports_conversation_id_request_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.verification_reports
    ADD CONSTRAINT verification_reports_conversation_id_request_id_fkey FOREIGN KEY (conversation_id, request_id) REFERENCES public.requests(conversation_id, request_id) ON DELETE CASCADE;


--
-- PostgreSQL database dump complete
--


