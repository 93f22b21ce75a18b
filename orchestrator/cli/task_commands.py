"""`wakeloop task add|list|cancel|rm`: the agent's task queue.

Not here: the queue's file (records/tasks.py), how a wake claims a task (wake/).
"""

from __future__ import annotations

from orchestrator.cli.declare import command, group, json_flag, print_json
from orchestrator.errors import EXIT_OK
from orchestrator.policy.agent import load_agent


def cmd_task_add(args) -> int:
    from orchestrator.records.tasks import add_task

    agent = load_agent(args.agent_dir)
    task = add_task(agent.state_dir, args.title)
    print(f"queued {task.id} for {agent.name}: {task.title}")
    return EXIT_OK


def cmd_task_cancel(args) -> int:
    from orchestrator.records.tasks import cancel

    agent = load_agent(args.agent_dir)
    task = cancel(agent.state_dir, args.id, args.note or "")
    print(f"cancelled {task.id} of {agent.name}: no wake takes it; `wakeloop task rm` removes it from the list")
    return EXIT_OK


def cmd_task_rm(args) -> int:
    from orchestrator.records.tasks import remove

    agent = load_agent(args.agent_dir)
    task = remove(agent.state_dir, args.id)
    print(f"removed {task.id} ({task.status}) from the tasks of {agent.name}: {task.title}")
    return EXIT_OK


def cmd_task_list(args) -> int:
    from orchestrator.records.tasks import load_tasks
    from orchestrator.sandbox.containers.output import clean

    agent = load_agent(args.agent_dir)
    tasks = load_tasks(agent.state_dir)
    if args.json:
        from dataclasses import asdict

        print_json([asdict(t) for t in tasks])
        return EXIT_OK
    for t in tasks:
        closed = f" ({t.finished_at}: {clean(t.note)})" if t.finished_at else ""
        print(f"{t.id:<5} {t.status:<8} {t.title}{closed}")
    if not tasks:
        print(f"(no tasks for {agent.name}; add one with `wakeloop task add {args.agent_dir} TITLE`)")
    return EXIT_OK


def add_task(commands) -> None:
    """`wakeloop task add|list|cancel|rm`."""
    task = group(
        commands,
        "task",
        "the agent's task queue (one task claimed per wake)",
        "wakeloop task add agents/mine 'summarise the logs'",
    )
    p = command(
        task,
        "add",
        "queue a task for the agent's next wakes",
        "wakeloop task add agents/mine 'summarise the logs'",
        cmd_task_add,
    )
    p.add_argument("agent_dir")
    p.add_argument("title")
    p = command(task, "list", "every task with its status", "wakeloop task list agents/mine --json", cmd_task_list)
    p.add_argument("agent_dir")
    json_flag(p, "the tasks as a JSON list")
    p = command(
        task,
        "cancel",
        "cancel an open task (todo, or claimed by a wake): no wake takes it again; it stays listed, with your note",
        "wakeloop task cancel agents/mine t3 --note 'done by hand'",
        cmd_task_cancel,
    )
    p.add_argument("agent_dir")
    p.add_argument("id", help="the task's id (t1, t2, ...: `wakeloop task list` shows them)")
    p.add_argument("--note", metavar="TEXT", help="why, kept with the task")
    p = command(
        task,
        "rm",
        "remove a task from the list, whatever its status (its id is not given again)",
        "wakeloop task rm agents/mine t3",
        cmd_task_rm,
    )
    p.add_argument("agent_dir")
    p.add_argument("id", help="the task's id (t1, t2, ...: `wakeloop task list` shows them)")
