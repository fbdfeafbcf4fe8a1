"""Splits the gateway's and the bare relay's round trips into steps, from system calls recorded by
scripts/trace-roundtrip.sh. A round trip starts where a worker reads a prompt's frame from its
socket; its steps end at the worker's write to the agent's stdin, its read of the agent's answer,
its last write to the WAL (the commit), its write of the frames, and the client's read of them.

Usage: python3 scripts/roundtrip_trace.py FDS SCRIPT   (the bench process's fds; `perf script`)
"""
import re
import statistics
import sys
from collections import defaultdict

READS = ('read', 'recvfrom')


def fd_kinds(path):
    kinds = {}
    for line in open(path):
        m = re.search(r' (\d+) -> (.*)$', line)
        if m:
            t = m.group(2)
            kinds[int(m.group(1))] = ('sock' if t.startswith('socket') else 'pipe' if t.startswith('pipe')
                                      else 'file' if t.startswith('/') else 'other')
    return kinds


def calls(path):
    """Each system call as (comm, tid, start µs, end µs, name, fd or None, result)."""
    line_re = re.compile(r'^\s*(\S+)\s+(\d+)\s+([\d.]+):\s+syscalls:sys_(enter|exit)_(\w+):\s+'
                         r'(?:(\w+): 0x([0-9a-f]+)|(0x[0-9a-f]+))')
    started, out = {}, []
    for line in open(path):
        m = line_re.match(line)
        if not m:
            continue
        comm, tid, ts, side, name, arg, a0, ret = m.groups()
        tid, ts = int(tid), float(ts) * 1e6
        if side == 'enter':
            started[tid] = (ts, name, int(a0, 16) if arg == 'fd' else None)
        elif tid in started and started[tid][1] == name:
            t0, _, fd = started.pop(tid)
            r = int(ret, 16)
            out.append(dict(comm=comm, tid=tid, t0=t0, t1=ts, name=name, fd=fd, ret=r - (1 << 64) if r >= 1 << 63 else r))
    return sorted(out, key=lambda e: e['t0'])


def main(fds_path, script_path):
    kinds = fd_kinds(fds_path)
    ev = calls(script_path)

    def kind(e):
        k = kinds.get(e['fd'], 'other') if e['fd'] is not None else e['name']
        return f"{k}_{'r' if e['name'] in READS else 'w'}" if e['fd'] is not None else k

    client = lambda e: e['comm'].startswith('gateway-')
    agent = lambda e: e['comm'].startswith('tokio-rt-work') or e['comm'] == 'acp-gateway'
    for label, prefixes in (('gateway', ('gw-worker', 'transcript-wri')), ('relay', ('relay-worker',))):
        mine = lambda e: e['comm'].startswith(prefixes)
        starts = [i for i, e in enumerate(ev) if mine(e) and kind(e) == 'sock_r' and e['ret'] > 100]
        steps = defaultdict(list)
        for a, b in zip(starts, starts[1:]):
            frame = ev[a]
            seg = [e for e in ev[a:b] if mine(e)]
            sent = [e for e in ev[max(0, a - 400):a] if client(e) and e['name'] in ('sendto', 'write') and e['ret'] > 100]
            stdin = [e for e in seg if kind(e) == 'pipe_w']
            answer = [e for e in seg if kind(e) == 'pipe_r' and e['ret'] > 0]
            wal = [e for e in seg if kind(e) == 'file_w']
            out = [e for e in seg if kind(e) == 'sock_w']
            if not (sent and stdin and answer and out) or frame['t1'] - sent[-1]['t0'] > 5000:
                continue
            got = [e for e in ev[a:b + 50] if client(e) and e['name'] in READS and e['ret'] > 0 and e['t1'] >= out[-1]['t0']]
            if not got:
                continue
            t_sent, t_frame, t_stdin, t_answer = sent[-1]['t0'], frame['t1'], stdin[0]['t0'], answer[0]['t1']
            steps['total: the client sends -> it has the answer'].append(got[0]['t1'] - t_sent)
            steps['1 in: the client sends -> a worker has the frame'].append(t_frame - t_sent)
            steps['2 in: the frame -> the line written to the agent'].append(t_stdin - t_frame)
            steps['3 the agent: the line written -> its answer read'].append(t_answer - t_stdin)
            after = [e for e in seg if e['tid'] == stdin[0]['tid'] and e['t0'] > stdin[0]['t1']]
            if after:
                steps['3a of which the writing worker works on, until its next call'].append(after[0]['t0'] - stdin[0]['t1'])
            theirs = [e for e in ev[a:b] if agent(e) and t_stdin <= e['t1'] <= t_answer]
            steps['3b of which the agent makes system calls'].append(len(theirs))
            if wal:
                steps['4 store: the answer read -> the commit written'].append(wal[-1]['t1'] - t_answer)
                steps['5 out: the commit written -> the frames sent'].append(out[-1]['t1'] - wal[-1]['t1'])
            else:
                steps['4+5 out: the answer read -> the frames sent'].append(out[-1]['t1'] - t_answer)
            steps['6 out: the frames sent -> the client has them'].append(got[0]['t1'] - out[-1]['t1'])
            steps['n: system calls of the path'].append(len(seg))
            steps['n: WAL writes'].append(len(wal))
            steps['n: socket writes'].append(len(out))
            steps['n: threads of the path'].append(len({e['tid'] for e in seg}))
        n = len(steps['total: the client sends -> it has the answer'])
        print(f'== {label}: {n} round trips; µs, p50 [p25-p75]')
        for key in sorted(steps):
            v = sorted(steps[key])
            q = lambda p: v[min(len(v) - 1, int(p * len(v)))]
            print(f'  {key:62s} {statistics.median(v):7.1f}  [{q(.25):.0f}-{q(.75):.0f}]')


if __name__ == '__main__':
    main(*sys.argv[1:3])
