"""tools/launch_nodes.sh with a stand-in ssh that runs each host's command on this machine."""

import os
import shutil
import subprocess
import time

import pytest

from test.helpers import REPO_ROOT, alive

LAUNCH = os.path.join(REPO_ROOT, "tools", "launch_nodes.sh")


def launch(tmp_path, command, *options, env=None, hosts="node-a   # node 0\n\n# a comment line\nnode-b\n"):
    fake_ssh, hostfile = tmp_path / "ssh", tmp_path / "hosts"
    fake_ssh.write_text('#!/usr/bin/env bash\necho "$1" >> "$(dirname "$0")/contacted"\nexec bash -c "$2"\n')
    fake_ssh.chmod(0o755)
    hostfile.write_text(hosts)
    return subprocess.run([LAUNCH, "--hostfile", str(hostfile), "--ssh", str(fake_ssh), *options, "--", command],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path, env={**os.environ, **(env or {})})


def test_every_host_runs_the_command_with_the_rendezvous_settings_and_named_output(tmp_path):
    proc = launch(tmp_path, 'echo "rank $NODE_RANK of $NUM_NODES at $HOST_NODE_ADDR in $PWD gloo=$GLOO_SOCKET_IFNAME"',
                  "--port", "29555", env={"GLOO_SOCKET_IFNAME": "lo"})
    assert proc.returncode == 0, proc.stderr
    lines = sorted(proc.stdout.splitlines())
    assert lines == [f"[node-a] rank 0 of 2 at node-a:29555 in {tmp_path} gloo=lo",
                     f"[node-b] rank 1 of 2 at node-a:29555 in {tmp_path} gloo=lo"]
    assert sorted((tmp_path / "contacted").read_text().split()) == ["node-a", "node-b"]


def test_dry_run_prints_one_ssh_line_per_host_and_runs_nothing(tmp_path):
    proc = launch(tmp_path, "touch ran", "--dry_run", "true", "--host_node_addr", "10.0.0.1:29400")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 2 and " node-a " in lines[0] and " node-b " in lines[1]
    assert all("HOST_NODE_ADDR=10.0.0.1:29400" in line and "touch\\ ran" in line for line in lines)
    assert not (tmp_path / "ran").exists() and not (tmp_path / "contacted").exists()


def test_a_failing_host_stops_the_others_with_its_status(tmp_path):
    started = time.monotonic()
    proc = launch(tmp_path, 'if [ "$NODE_RANK" = 1 ]; then exit 3; fi; sleep 30; touch survived')
    assert proc.returncode == 3
    assert "node-b exited with status 3; stopping the other hosts" in proc.stderr
    assert time.monotonic() - started < 20
    time.sleep(0.5)
    assert not (tmp_path / "survived").exists()


def test_bad_invocations_are_one_line_errors(tmp_path):
    (tmp_path / "empty").write_text("# nobody\n")
    for args, message in [([], "--hostfile is required"),
                          (["--hostfile", str(tmp_path / "nope")], "no such file"),
                          (["--hostfile", str(tmp_path / "empty"), "--", "true"], "lists no host"),
                          (["--hostfile", str(tmp_path / "empty")], "no command given")]:
        proc = subprocess.run([LAUNCH, *args], capture_output=True, text=True, timeout=30)
        assert proc.returncode == 1 and message in proc.stderr, (args, proc.stderr)


@pytest.mark.parametrize("hosts, address, destinations", [
    ("alice@node0\nalice@node1\n", "node0:29400", ["alice@node0", "alice@node1"]),  # the launcher-user-host case
    ("# rack 1\r\n\r\n  alice@node0  # node 0\r\nnode1\r\n", "node0:29400", ["alice@node0", "node1"]),  # CRLF
    ("fe80::1\nbob@fe80::2\n", "[fe80::1]:29400", ["fe80::1", "bob@fe80::2"]),  # IPv6, bare as ssh takes it
    ("ssh://alice@node0:2222\nnode1\n", "node0:29400", ["ssh://alice@node0:2222", "node1"]),  # ssh's URI, its port
])
def test_the_rendezvous_address_is_the_host_part_of_the_first_ssh_destination(tmp_path, hosts, address,
                                                                                destinations):
    proc = launch(tmp_path, 'echo "$NODE_RANK $HOST_NODE_ADDR"', hosts=hosts)
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == sorted([f"[{destinations[0]}] 0 {address}",
                                                       f"[{destinations[1]}] 1 {address}"])
    assert sorted((tmp_path / "contacted").read_text().split()) == sorted(destinations)


@pytest.mark.parametrize("hosts, line, message", [
    ("[::1]\nnode1\n", "1: '[::1]'", "ssh takes no address in brackets; write the IPv6 address bare, ::1"),
    ("alice@node0:2222\n", "1: 'alice@node0:2222'", "ssh takes no host:port; write ssh://alice@node0:2222"),
    ("node0\n# two\nnode1 slots=8\n", "3: 'node1 slots=8'", "not one ssh destination ([user@]host)"),
    ("alice@\n", "1: 'alice@'", "not one ssh destination"),
])
def test_a_hostfile_line_that_is_no_ssh_destination_is_refused_in_one_line(tmp_path, hosts, line, message):
    proc = launch(tmp_path, "touch ran", hosts=hosts)
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert f"hosts:{line}: {message}" in proc.stderr
    assert not (tmp_path / "ran").exists() and not (tmp_path / "contacted").exists()


def test_a_launcher_killed_with_sigkill_stops_every_host_command(tmp_path):
    # kill -9 runs no trap: each host's watchdog sees the launcher gone and stops that host's ssh and its command
    fake_ssh, hostfile = tmp_path / "ssh", tmp_path / "hosts"
    fake_ssh.write_text('#!/usr/bin/env bash\nexec bash -c "$2"\n')
    fake_ssh.chmod(0o755)
    hostfile.write_text("node-a\nnode-b\n")
    proc = subprocess.Popen([LAUNCH, "--hostfile", str(hostfile), "--ssh", str(fake_ssh), "--",
                             'echo $$ > pid$NODE_RANK; sleep 60'], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pids = [tmp_path / f"pid{rank}" for rank in range(2)]
    deadline = time.monotonic() + 20
    while not all(p.exists() and p.read_text().strip() for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    commands = [int(p.read_text()) for p in pids]
    proc.kill()
    proc.wait()
    killed = time.monotonic()
    while any(alive(pid) for pid in commands) and time.monotonic() - killed < 5:
        time.sleep(0.1)
    running = [pid for pid in commands if alive(pid)]
    for pid in running:
        os.kill(pid, 9)
    assert not running


@pytest.mark.skipif(shutil.which("ssh") is None, reason="ssh is not installed")
@pytest.mark.parametrize("hosts, address", [
    ("myalias\nnode1\n", "10.0.0.5:29400"),  # a Host alias: its HostName, as ssh connects to it
    ("alice@myalias\nnode1\n", "10.0.0.5:29400"),
    ("ssh://alice@myalias:2222\nnode1\n", "10.0.0.5:29400"),
    ("v6alias\nnode1\n", "[fe80::7]:29400"),
    ("expanded\nnode1\n", "expanded.example.org:29400"),  # HostName %h.example.org
])
def test_the_rendezvous_address_is_the_hostname_ssh_connects_to(tmp_path, hosts, address):
    config = tmp_path / "ssh_config"
    config.write_text("Host myalias\n  HostName 10.0.0.5\n  User bob\nHost v6alias\n  HostName fe80::7\n"
                      "Host expanded\n  HostName %h.example.org\n")
    proc = launch(tmp_path, 'echo "$NODE_RANK $HOST_NODE_ADDR"', "--resolve", f"ssh -F {config} -G", hosts=hosts)
    assert proc.returncode == 0, proc.stderr
    first = hosts.splitlines()[0]
    assert sorted(proc.stdout.splitlines()) == sorted([f"[{first}] 0 {address}", f"[node1] 1 {address}"])
    assert (f"rendezvous at {address}, derived from {tmp_path / 'hosts'}:1 '{first}' (ssh -F {config} -G {first}: "
            f"hostname {address.rsplit(':', 1)[0].strip('[]')})") in proc.stderr


def test_without_ssh_settings_the_rendezvous_address_is_the_host_part(tmp_path):
    proc = launch(tmp_path, 'echo "$NODE_RANK $HOST_NODE_ADDR"', "--resolve", "false", hosts="alice@myalias\nb\n")
    assert proc.returncode == 0, proc.stderr
    assert "[alice@myalias] 0 myalias:29400" in proc.stdout.splitlines()
    assert (f"rendezvous at myalias:29400, derived from {tmp_path / 'hosts'}:1 'alice@myalias' (its host part: "
            "'false' gave no hostname)") in proc.stderr
