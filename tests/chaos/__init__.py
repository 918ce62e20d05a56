"""The chaos harness (issue 13, item 4): ``make chaos`` / ``python -m tests.chaos``.

Not part of ``make test`` (pytest does not collect this folder; see ``norecursedirs``).

On its own local stack (``LocalStack``: PostgreSQL, SeaweedFS + Tansu, Redis, the schema
registry, on free ports in a temporary folder) and with every long-running part under one
``tributary run`` (CDC, the command processor, the views, the HTTP API), a steady workload runs
throughout: commands through the ``commands`` topic and through ``POST /commands`` (the social
demo's CreatePost / EditPost / DeletePost / FollowUser / UnfollowUser) and plain SQL writes to
the CDC-captured ``public.users`` table (new users, renames).

Each part is killed with ``kill -9`` in turn, ``--trials`` times (default 20): the supervisor
itself, the CDC connector, the command processor, the views job (one process runs every view's
Spark query: search, profile, timeline, the users mirror), the HTTP server, PostgreSQL, Redis,
the broker and the object store. PIDs come from the parts' own state only: the supervisor's
announcements (``run: <part>: started (pid N)``) and the stack's pid files
(``<home>/run/<service>.pid``) -- never from a process name. A supervised part is restarted by
the supervisor; a killed supervisor is started again by the harness (after its children ended
with it); a stack service is started again the way ``tributary up`` does (``LocalStack.up``,
which starts whatever is not running).

Two more parts. ``broker-loss``: ``kill -9`` of the broker, which then loses the acknowledged
records the data topics (``events.*``, the CDC topics) received in the last second before the
kill (``tests/chaos/loss.py`` deletes their batches from the broker's storage while it is down:
the loss ``../shared/ENVIRONMENT.md`` measured, which this build did not repeat by itself); the
check prints what the broker dropped, what ``tributary verify`` named and what the views lacked
before ``tributary repair``, then what repair did. ``load`` (issue 13, item 5, with the views
running): no kill; 16 senders (8 through the topic, 8 through HTTP) send without pause for
``--load-seconds``; then the views must equal the reference (its "time to recover" is the time
from the pause of the senders until they do).

Time to recover (per trial): from the kill until a probe written after the kill is visible in
every view -- a CreatePost through the topic, a CreatePost through HTTP (both by a probe user
whom a probe follower follows) and a SQL update of the probe user's bio: the two posts in the
search index and the follower's timeline, the new bio in the users mirror and the profile cache.

After each part's trials the workload pauses (every command in flight gets its answer), for the
broker, ``broker-loss`` and the object store ``tributary repair`` runs (a broker may lose its
last acknowledged records on ``kill -9``), the harness waits for the views to converge, then
compares every topic and view with the reference computed from the source of truth (the event
store and the users table), with the reference functions of the views' tests
(``examples.social.views.reference``).

Definitions (counted per part: only differences that were not there at the previous check):

**Lost** -- something the source of truth holds that a topic or view lacks:

- commands: a command the workload sent that never got a result (after re-sending it with the
  same command id for the whole run), or an accepted command whose events (by event id) are not
  in the event store;
- ``events.*``: an event of the event store (stream, version) missing from its topic;
- ``cdc.public.users``: a row of the table missing from the topic, or whose latest change on the
  topic is not the row as it is (stale), or a key the table no longer has;
- users mirror: a row missing, differing from the table, or present though not in the table;
- search index: a live post missing, a document differing from the post and its author (a lost
  edit or rename), or a document of a deleted post;
- profile cache: a user's profile missing or a field differing (handle, name, bio), and for each
  counter (followers, following, posts) below the reference, the shortfall;
- timelines: each (user, post) the reference has and the view lacks, and each the view has and
  the reference does not (a lost delete or unfollow).

**Applied twice** -- an effect present more often than the source of truth says:

- commands: events stored for one command id beyond the events of its one recorded result (the
  same command decided twice), or two different accepted results for one command id;
- ``events.*``: an event on a topic that the event store does not have;
- profile cache: for each counter above the reference, the excess;
- timelines: a post listed twice in one user's timeline.

A record re-delivered on a topic (at-least-once: the same event or change again, at the same
position) is not applied twice unless a view shows it; the comparison of the views says so.
"""
