"""The policy file: validation with one-line messages, sizes, globs, the shipped
policies, the engine checks and `policy check` / `policy explain` (issue 4)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from orchestrator.errors import ConfigError
from orchestrator.policy.agent import init_agent, load_agent
from orchestrator.policy.load import parse_policy, parse_size
from orchestrator.policy.paths import glob_match, normalise
from orchestrator.policy.schema import DEFAULT, PolicyError, WriteFileTool
from orchestrator.sandbox.policy_check import check_against_engine
from tests.helpers import REPO

SHIPPED = sorted(p for p in (REPO / "policies").glob("*.yaml") if p.name != "ceiling.yaml")  # not a policy
CLI = [sys.executable, "-m", "orchestrator"]
CLI_TIMEOUT_S = 60  # one CLI run; explain talks to the engine


def error_of(text: str) -> str:
    with pytest.raises(PolicyError) as caught:
        parse_policy(text, "p.yaml")
    message = str(caught.value)
    assert "\n" not in message, "a policy error is one line"
    return message


# (policy text, the exact one-line message): file, line, key path, reason.
BAD = [
    (
        "sandbox:\n  memory: 512x\n",
        "p.yaml:2: sandbox.memory: expected a size like 64m, 1g, 1GiB or plain bytes, got '512x'",
    ),
    (
        "sandbox:\n  memroy: 1g\n",
        "p.yaml:2: sandbox.memroy: unknown key (did you mean 'memory'? known here: allow_hosts, cpus, ",
    ),
    ("version: 1\nfoo: 1\n", "p.yaml:2: foo: unknown key ("),
    ("budget:\n  max_steps: -3\n", "p.yaml:2: budget.max_steps: must be greater than zero, got -3"),
    ("budget:\n  max_steps: 0\n", "p.yaml:2: budget.max_steps: must be greater than zero, got 0"),
    ("budget:\n  max_steps: 2.5\n", "p.yaml:2: budget.max_steps: expected a whole number, got 2.5"),
    ("budget:\n  max_steps: lots\n", "p.yaml:2: budget.max_steps: expected a number, got a string 'lots'"),
    (
        "tools:\n  bash:\n    enabled: yes please\n",
        "p.yaml:3: tools.bash.enabled: expected true or false, got 'yes please'",
    ),
    ("tools:\n  bash:\n    timeout_s: 0\n", "p.yaml:3: tools.bash.timeout_s: must be greater than zero, got 0"),
    ("tools: [bash]\n", "p.yaml:1: tools: expected a mapping of keys, got a list"),
    (
        "tools:\n  write_file:\n    max_bytes: -1\n",
        "p.yaml:3: tools.write_file.max_bytes: must be greater than zero, got -1",
    ),
    (
        "tools:\n  write_file:\n    allow: '**'\n",
        "p.yaml:3: tools.write_file.allow: expected a list of globs such as ['**'], got a string",
    ),
    (
        "tools:\n  write_file:\n    deny:\n      - ok/**\n      - /etc/**\n",
        "p.yaml:5: tools.write_file.deny[1]: '/etc/**' is absolute; globs are relative to /workspace",
    ),
    (
        "tools:\n  write_file:\n    allow: ['../up/**']\n",
        "p.yaml:3: tools.write_file.allow[0]: '../up/**' contains '..'",
    ),
    (
        "tools:\n  send_message:\n    max_per_wake: 0\n",
        "p.yaml:3: tools.send_message.max_per_wake: must be greater than zero, got 0",
    ),
    (
        "sandbox:\n  network: internet\n",
        "p.yaml:2: sandbox.network: expected one of none, allowlist, bridge, got 'internet'",
    ),
    (
        "sandbox:\n  network: allowlist\n",
        "p.yaml:2: sandbox.network: allowlist needs at least one entry in sandbox.allow_hosts",
    ),
    (
        "sandbox:\n  allow_hosts: [pypi.org]\n",
        "p.yaml:2: sandbox.allow_hosts: only used with network: allowlist (network is none)",
    ),
    (
        "sandbox:\n  network: allowlist\n  allow_hosts:\n    - pypi.org\n    - 'http://x.org/'\n",
        "p.yaml:5: sandbox.allow_hosts[1]: expected host, host:port or *.domain, got 'http://x.org/'",
    ),
    (
        "sandbox:\n  network: allowlist\n  allow_hosts: [169.254.169.254]\n",
        "p.yaml:3: sandbox.allow_hosts[0]: '169.254.169.254' is an IP address; name the host",
    ),
    (
        "sandbox:\n  network: allowlist\n  allow_hosts: ['pypi.org:99999']\n",
        "p.yaml:3: sandbox.allow_hosts[0]: port 99999 in 'pypi.org:99999' is not between 1 and 65535",
    ),
    (
        "sandbox:\n  network: allowlist\n  allow_hosts: ['*.org']\n",
        "p.yaml:3: sandbox.allow_hosts[0]: '*.org' would allow a whole top-level domain",
    ),
    (
        "sandbox:\n  user: root\n",
        'p.yaml:2: sandbox.user: expected "auto" or "UID:GID" such as "1000:1000", got \'root\'',
    ),
    (
        "sandbox:\n  user: '0:1000'\n",
        "p.yaml:2: sandbox.user: '0:1000' is root; the sandbox never runs as uid or gid 0",
    ),
    ("sandbox:\n  cpus: -1\n", "p.yaml:2: sandbox.cpus: must be greater than zero, got -1"),
    ("sandbox:\n  pids: 0\n", "p.yaml:2: sandbox.pids: must be greater than zero, got 0"),
    ("sandbox:\n  memory: 1k\n", "p.yaml:2: sandbox.memory: '1k' is below the engine's minimum of 6m"),
    ("sandbox:\n  tmp_size: 0\n", "p.yaml:2: sandbox.tmp_size: must be greater than zero, got 0"),
    ("sandbox:\n  env: [A=1]\n", "p.yaml:2: sandbox.env: expected a mapping of NAME: value, got a list"),
    (
        "sandbox:\n  env:\n    OK: 1\n    ANTHROPIC_API_KEY: sk\n",
        "p.yaml:4: sandbox.env.ANTHROPIC_API_KEY: reserved: wakeloop sets the proxy variables itself",
    ),
    ("sandbox:\n  env:\n    HTTPS_PROXY: http://evil\n", "p.yaml:3: sandbox.env.HTTPS_PROXY: reserved"),
    ("sandbox:\n  env:\n    1BAD: x\n", "p.yaml:3: sandbox.env.1BAD: not a valid environment variable name"),
    (
        "sandbox:\n  runtime: 'run c'\n",
        "p.yaml:2: sandbox.runtime: expected a runtime name such as runc or runsc, got 'run c'",
    ),
    ("sandbox:\n  image: ''\n", "p.yaml:2: sandbox.image: expected a non-empty string, got a string ''"),
    ("version: 2\n", "p.yaml:1: version: this wakeloop reads policy version 1, got 2"),
    ("sandbox:\n  pids: 10\n  pids: 20\n", "p.yaml:3: sandbox.pids: duplicate key (first on line 2)"),
    ("sandbox:\n  memory: [1\n", "p.yaml:3: not valid YAML: "),
    ("- just\n- a list\n", "p.yaml: (top level): expected a mapping of keys, got a list"),
]


@pytest.mark.parametrize("text, expected", BAD, ids=[f"bad{i}" for i in range(len(BAD))])
def test_bad_policy_gives_one_line_naming_file_line_and_key(text, expected):
    assert error_of(text).startswith(expected)


LOADER_NAMES = [
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
    "LD_AUDIT",
    "BASH_ENV",
    "ENV",
    "BASH_FUNC_ls",
    "SHELLOPTS",
    "IFS",
    "PS4",
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONSTARTUP",
    "PERL5LIB",
    "PERL5OPT",
    "RUBYOPT",
    "NODE_OPTIONS",
    "GCONV_PATH",
    "GLIBC_TUNABLES",
    "HOSTALIASES",
    "LOCALDOMAIN",
    "RES_OPTIONS",
]


@pytest.mark.parametrize("name", LOADER_NAMES)
def test_blocks_loader_variables_in_policy(name):
    text = f"sandbox:\n  env:\n    OK: 1\n    {name}: /workspace/x\n"
    assert error_of(text) == (
        f"p.yaml:4: sandbox.env.{name}: refused: it changes how programs load or "
        "start (loader, shell or interpreter startup); set it in the command instead"
    )


def test_a_workspace_path_first_on_path_and_a_tmpdir_stay_allowed():
    # Harmless to the harness: its programs run by absolute path under their own environment.
    policy = parse_policy(
        "sandbox:\n  env: {PATH: '/workspace/bin:/usr/bin:/bin', TMPDIR: /workspace/tmp,"
        " LD: x, PYTHON: y, ENVIRONMENT: z}\n",
        "p.yaml",
    )
    assert dict(policy.sandbox.env)["PATH"] == "/workspace/bin:/usr/bin:/bin"


def test_there_are_at_least_fifteen_bad_policies():
    assert len(BAD) >= 15


def test_empty_file_is_the_default_policy():
    policy = parse_policy("", "p.yaml")
    assert (policy.budget, policy.tools, policy.sandbox) == (DEFAULT.budget, DEFAULT.tools, DEFAULT.sandbox)


def test_good_policy_is_read_into_the_dataclasses():
    policy = parse_policy(
        "version: 1\n"
        "tools:\n"
        "  bash: {enabled: false}\n"
        "  write_file: {max_bytes: 64k, allow: ['docs/**'], deny: ['docs/private/**']}\n"
        "  send_message: {max_per_wake: 2}\n"
        "sandbox:\n"
        "  user: '1234:1234'\n"
        "  cpus: 0.5\n"
        "  memory: 1GiB\n"
        "  network: allowlist\n"
        "  allow_hosts: [PyPI.org, 'files.example.org:8443', '*.example.net']\n"
        "  env: {DEBUG: true, LEVEL: 3}\n",
        "p.yaml",
    )
    assert policy.tools.bash.enabled is False
    assert policy.tools.write_file.max_bytes == 65536
    assert policy.tools.send_message.max_per_wake == 2
    assert policy.sandbox.memory == 2**30 and policy.sandbox.cpus == 0.5
    assert policy.sandbox.allow_hosts == ("pypi.org", "files.example.org:8443", "*.example.net")
    assert policy.sandbox.env == (("DEBUG", "true"), ("LEVEL", "3"))
    assert policy.where("sandbox.memory") == "p.yaml:9"


@pytest.mark.parametrize(
    "text, size",
    [
        ("64m", 64 * 2**20),
        ("1g", 2**30),
        ("1GiB", 2**30),
        ("512MB", 512 * 2**20),
        ("2k", 2048),
        ("100b", 100),
        (4096, 4096),
        ("1.5g", 3 * 2**29),
        ("  8 M ", 8 * 2**20),
        ("1t", 2**40),
    ],
)
def test_sizes(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["512x", "1ib", "g", "-1m", "1 gb extra", "", "1e3", True, 1.5])
def test_bad_sizes(text):
    with pytest.raises(ValueError):
        parse_size(text)


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_shipped_policies_pass_policy_check(path):
    done = subprocess.run(
        CLI + ["policy", "check", str(path)], capture_output=True, text=True, cwd=REPO, timeout=CLI_TIMEOUT_S
    )
    assert (done.returncode, done.stdout.strip()) == (0, f"ok: {path}"), done.stderr


def test_shipped_policies_are_the_three_the_issue_names():
    assert {p.name for p in SHIPPED} >= {"default.yaml", "strict.yaml", "networked.yaml"}


def test_init_with_a_policy_that_is_neither_shipped_nor_a_file_fails_at_once_naming_the_shipped_ones(tmp_path):
    done = subprocess.run(
        CLI + ["init", str(tmp_path / "typo"), "--policy", "strcit"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "--policy strcit: neither a shipped policy (default, strict, networked) nor a policy file" in done.stderr
    assert "nothing was created" in done.stderr and not (tmp_path / "typo").exists()
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "p.yaml").write_text("version: 1\nbudget:\n  max_steps: lots\n")
    with pytest.raises(ConfigError, match=r"p.yaml:3: budget.max_steps: .*\); nothing was created$"):
        init_agent(tmp_path / "mine", policy="p.yaml")
    assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == ["p.yaml"]
    for good in ("strict", str(REPO / "policies" / "networked.yaml")):
        assert load_agent(init_agent(tmp_path / good.replace("/", "_"), policy=good)).policy.source


def test_shipped_policies_say_the_globs_bind_write_file_only():
    for name in ("default.yaml", "strict.yaml", "networked.yaml"):
        text = (REPO / "policies" / name).read_text()
        assert "write_file" in text and "bash" in text
    default = (REPO / "policies/default.yaml").read_text()
    assert "BIND THE write_file TOOL ONLY" in default and "CVE-2021-30465" in default


def test_policy_check_bad_file_exits_2_with_the_reason(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("sandbox:\n  network: allowlist\n  allow_hosts: [pypi.org]\n  pids: many\n")
    done = subprocess.run(CLI + ["policy", "check", str(bad)], capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == f"wakeloop: {bad}:4: sandbox.pids: expected a number, got a string 'many'\n"


def test_policy_check_missing_file_exits_2(tmp_path):
    done = subprocess.run(
        CLI + ["policy", "check", str(tmp_path / "nope.yaml")], capture_output=True, text=True, timeout=CLI_TIMEOUT_S
    )
    assert done.returncode == 2 and "cannot read policy" in done.stderr


# -- write_file globs -------------------------------------------------------------------


@pytest.mark.parametrize(
    "pattern, path, matches",
    [
        ("**", "a", True),
        ("**", "a/b/c", True),
        ("**/x", "x", True),
        ("**/x", "a/b/x", True),
        ("docs/**", "docs/a/b.md", True),
        ("docs/**", "docsx/a", False),
        ("*.md", "README.md", True),
        ("*.md", "a/README.md", False),
        ("**/*.md", "a/b/README.md", True),
        ("*", ".hidden", True),
        ("a/*/c", "a/b/c", True),
        ("a/*/c", "a/b/b/c", False),
        ("a/**/c", "a/c", True),
        ("file?.txt", "file1.txt", True),
        ("file?.txt", "file10.txt", False),
        ("[ab].txt", "b.txt", True),
        ("Docs/**", "docs/x", False),
    ],
)
def test_glob_semantics(pattern, path, matches):
    assert glob_match(pattern, path) is matches


@pytest.mark.parametrize(
    "raw, rel",
    [
        ("a.txt", "a.txt"),
        ("./a//b/", "a/b"),
        ("a/./b", "a/b"),
        ("a/../b", None),  # the box refuses any '..' (a/ may be a link), so the policy never calls it b
        ("../x", None),
        ("/etc/passwd", None),
        (".", None),
        ("a/../..", None),
        ("x\ny", None),
        ("", None),
    ],
)
def test_paths_are_normalised_first(raw, rel):
    assert normalise(raw) == rel


@pytest.mark.parametrize(
    "raw", ["a.txt", "./a//b/", "a/../b", "../x", "/etc/x", ".", "./", "a\0b", "a\x7fb", "", "a/..", "..."]
)
def test_the_policy_and_the_box_apply_one_path_rule(raw):
    from orchestrator.policy import paths
    from orchestrator.sandbox import engine

    assert engine.check_write_path is paths.check_write_path  # the box's own copy is gone
    assert (normalise(raw) is None) == (paths.check_write_path(raw) is not None), raw


def test_git_hooks_and_config_are_denied_by_default_at_any_depth():
    w = DEFAULT.tools.write_file
    for path in (".git/hooks/pre-commit", "./.git//config", "sub/.git/hooks/post-checkout"):
        assert "(protect_git)" in w.refusal(path, 1), path
    assert "without '..'" in w.refusal("x/../.git/config", 1)  # no '..' at all, before .git is looked at
    assert w.refusal(".gitignore", 1) is None
    assert w.refusal(".github/workflows/ci.yml", 1) is None
    assert w.refusal("src/git/config", 1) is None
    assert WriteFileTool(protect_git=False).refusal(".git/config", 1) is None


@pytest.mark.parametrize(
    "path",
    [
        ".git",  # a gitdir: pointer file, redirecting git anywhere
        "vendor/lib/.git",  # ... at any depth (a submodule's own pointer)
        ".git/HEAD",  # anything under .git, not only hooks and config
        ".git/config.worktree",
        ".git/modules/lib/hooks/post-checkout",  # a submodule's hooks and config
        ".git/modules/lib/config",
        ".git/worktrees/w/commondir",
        ".git/info/attributes",
        ".GIT/hooks/x",
        ".Git/config",
        "a/.gIt/hooks/pre-commit",  # macOS and Windows fold case
        ".git./config",
        ".git /config",
        "GIT~1/config",  # NTFS trailing dots, 8.3 name
        ".g\u200cit/config",
        "\ufeff.git/hooks/x",  # HFS+ ignores these code points
    ],
)
def test_every_spelling_of_dot_git_is_denied_by_default(path):
    reason = DEFAULT.tools.write_file.refusal(path, 1)
    assert reason and "(protect_git)" in reason and "git's own directory" in reason, path
    assert "do not try another way round it" in reason
    assert WriteFileTool(protect_git=False).refusal(path, 1) is None


@pytest.mark.parametrize(
    "segment", [".gitignore", ".gitmodules", ".gitattributes", "git", ".github", "x.git", ".git2", "git~2"]
)
def test_names_merely_like_dot_git_stay_writable(segment):
    assert DEFAULT.tools.write_file.refusal(f"{segment}/a", 1) is None
    assert DEFAULT.tools.write_file.refusal(segment, 1) is None


def test_deny_wins_over_allow_and_every_refusal_is_a_sentence():
    w = parse_policy(
        "tools:\n  write_file:\n    allow: ['notes/**']\n    deny: ['notes/secret/**']\n    max_bytes: 10\n", "p.yaml"
    ).tools.write_file
    assert w.refusal("notes/a.md", 10) is None
    assert "deny glob 'notes/secret/**'" in w.refusal("notes/secret/k.md", 1)
    assert "allows only notes/**" in w.refusal("src/main.py", 1)
    assert "at most 10 bytes" in w.refusal("notes/a.md", 11)
    assert "not a path inside /workspace" in w.refusal("/workspace/../etc/x", 1)
    assert "disabled" in WriteFileTool(enabled=False).refusal("a", 1)


# -- against the live engine --------------------------------------------------------------


def test_engine_check_passes_for_the_default_policy(docker_client):
    check_against_engine(parse_policy("", "p.yaml"), docker_client)


def test_engine_check_names_a_missing_image_with_its_line(docker_client):
    policy = parse_policy("version: 1\nsandbox:\n  image: wakeloop-no-such-image:never\n", "p.yaml")
    with pytest.raises(
        PolicyError,
        match=r"^p\.yaml:3: sandbox\.image: wakeloop-no-such-image:never "
        r"is not on this engine",
    ):
        check_against_engine(policy, docker_client)


def test_engine_check_names_an_unknown_runtime_with_its_line(docker_client):
    policy = parse_policy("sandbox:\n  cpus: 1\n  runtime: kata-nonexistent\n", "p.yaml")
    with pytest.raises(
        PolicyError,
        match=r"^p\.yaml:3: sandbox\.runtime: the engine has no runtime "
        r"'kata-nonexistent' \(it has: .*runc",
    ):
        check_against_engine(policy, docker_client)


def test_engine_check_refuses_more_cpus_than_the_engine_has(docker_client):
    policy = parse_policy("sandbox:\n  cpus: 4096\n", "p.yaml")
    with pytest.raises(PolicyError, match=r"^p\.yaml:2: sandbox\.cpus: 4096 is more than the"):
        check_against_engine(policy, docker_client)


def test_engine_check_refuses_a_network_under_runsc_with_network_none(docker_client, engine_runtimes):
    if "runsc" not in engine_runtimes:
        pytest.skip("runtime runsc is not registered with this engine (run scripts/setup-runsc.sh)")
    policy = parse_policy("sandbox:\n  runtime: runsc\n  network: allowlist\n  allow_hosts: [pypi.org]\n", "p.yaml")
    with pytest.raises(
        PolicyError,
        match=r"^p\.yaml:3: sandbox\.network: runtime runsc is registered "
        r"with --network=none",
    ):
        check_against_engine(policy, docker_client)


def test_engine_check_refuses_too_few_pids_under_runsc(docker_client, engine_runtimes):
    if "runsc" not in engine_runtimes:
        pytest.skip("runtime runsc is not registered with this engine (run scripts/setup-runsc.sh)")
    policy = parse_policy("sandbox:\n  runtime: runsc\n  pids: 64\n", "p.yaml")
    with pytest.raises(PolicyError, match=r"^p\.yaml:3: sandbox\.pids: 64 is too few under gVisor"):
        check_against_engine(policy, docker_client)
    check_against_engine(parse_policy("sandbox:\n  runtime: runsc\n  pids: 128\n", "p.yaml"), docker_client)


# -- policy explain -----------------------------------------------------------------------


def explain(tmp_path, policy_file: str) -> str:
    agent_dir = init_agent(tmp_path / "agent", policy=str(REPO / "policies" / policy_file))
    done = subprocess.run(
        CLI + ["policy", "explain", str(agent_dir)], capture_output=True, text=True, timeout=CLI_TIMEOUT_S
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.docker
def test_explain_default_shows_tools_and_the_hardening_flags(tmp_path):
    out = explain(tmp_path, "default.yaml")
    assert "bash: timeout 120s" in out and "send_message: at most 5 per wake" in out
    assert "deny (wins): **/.git, **/.git/**" in out
    assert "protect_git: the .git globs match any case" in out and "embedded bare repository's config" in out
    assert "bash can write anywhere in /workspace" in out
    for flag in (
        "--network none",
        "--read-only",
        "--cap-drop ALL",
        "--security-opt no-new-privileges",
        "--pids-limit 256",
        f"--memory {512 * 2**20}",
        f"--memory-swap {512 * 2**20}",
        "--runtime runc",
        "--init",
        "--ipc private",
        "--ulimit core=0:0",
    ):
        assert f"    {flag} \\" in out, flag
    assert out.count("docker run") == 2 and "--unmapped" not in out


@pytest.mark.docker
def test_explain_strict_offers_write_file_alone(tmp_path):
    out = explain(tmp_path, "strict.yaml")
    assert "bash: NOT OFFERED" in out and "send_message: NOT OFFERED" in out
    assert "allow: memory/**, notes/**, *.md" in out
    assert out.count("docker run") == 1 and "python3 -I -c WRITE_SCRIPT PATH" in out
    assert "--pids-limit 128" in out and "--cpus 0.5" in out


@pytest.mark.parametrize(
    "text, says",
    [
        ("name: x\nmodel: m\nbogus: 1\n", "agent.yaml:3: bogus: unknown key (known: "),
        ("name: x\n\ndry_run: maybe\n", "agent.yaml:3: dry_run: expected true or false, got 'maybe'"),
        ("name: x\npolicy: 5\n", "agent.yaml:2: policy: expected a file path or a mapping"),
        ("name: x\npolicy:\n  sandbox: {memroy: 1g}\n", "agent.yaml:3: sandbox.memroy: unknown key"),
        # One parser for the schedule (policy/schedule_line.py): what serve refuses, every command refuses.
        ("name: x\nschedule: '*/5 * * *'\n", "agent.yaml:2: schedule: '*/5 * * *' is neither a cron line of five"),
        ("name: x\nschedule: '0 0 * * * *'\n", "agent.yaml:2: schedule: '0 0 * * * *' is neither a cron line"),
        ("name: x\nevery: 0.1s\n", "agent.yaml:2: every: interval '0.1s' is under 1s"),
        ("name: x\n\ntimezone: Mars/Olympus\n", "agent.yaml:3: timezone: timezone 'Mars/Olympus' is not an IANA"),
    ],
)
def test_agent_yaml_errors_name_the_file_line_and_key(tmp_path, text, says):
    from orchestrator.errors import ConfigError
    from orchestrator.policy.agent import load_agent

    (tmp_path / "agent.yaml").write_text(text)
    with pytest.raises(ConfigError) as err:
        load_agent(tmp_path)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_disk_and_files_are_read_and_none_is_a_plain_folder():
    policy = parse_policy("sandbox:\n  disk: 4g\n  files: 5000\n", "p.yaml")
    assert (policy.sandbox.disk, policy.sandbox.files) == (4 * 2**30, 5000)
    assert parse_policy("sandbox:\n  disk: none\n", "p.yaml").sandbox.disk == 0
    assert (DEFAULT.sandbox.disk, DEFAULT.sandbox.files) == (2 * 2**30, 100_000)


@pytest.mark.parametrize(
    "text, says",
    [
        ("sandbox:\n  disk: 1m\n", "p.yaml:2: sandbox.disk: '1m' is below the minimum of 16m"),
        ("sandbox:\n  disk: 0\n", "p.yaml:2: sandbox.disk: 0 is below the minimum of 16m (or none"),
        ("sandbox:\n  files: 10\n", "p.yaml:2: sandbox.files: expected a whole number of files, at least 64"),
        ("sandbox:\n  files: lots\n", "p.yaml:2: sandbox.files: expected a whole number of files"),
    ],
)
def test_a_disk_too_small_or_a_files_count_that_is_not_one_is_refused(text, says):
    assert error_of(text).startswith(says)
