"""What the console says to people who are not programmers: each hold code in plain words,
what each action on a held run would do, before they choose it, and what each kind of
event in a run's history means.

Every :class:`HoldCode` has words here (a test holds the two lists together), so a new hold
code cannot reach an operator as a bare code. The words say what Coordinator knows, what it
does not, and which actions are safe, in that order: the operator decides on evidence,
never on a guess that a product did or did not act.
"""

from __future__ import annotations

from dataclasses import dataclass

from registry_coordinator.semantics.codes import HoldCode


@dataclass(frozen=True)
class Hold:
    title: str
    known: str  # what Coordinator knows, and what it does not
    advice: str  # which action fits, and when
    #: The actions that can help, the one the advice recommends first, cancel last.
    offers: tuple[str, ...] = ("reconcile", "retry-same", "cancel")


HOLDS: dict[HoldCode, Hold] = {
    HoldCode.PRODUCT_FORBIDDEN: Hold(
        "The product refused Coordinator's credentials",
        "The product answered 401 or 403: it did not act on the request.",
        "Fix Coordinator's service identity for this product, or the product's policy, "
        "then retry the same request.",
        ("retry-same", "cancel"),
    ),
    HoldCode.OUTCOME_UNKNOWN: Hold(
        "Nobody knows whether the product acted",
        "The request may have reached the product, but no usable answer came back "
        "(a timeout, a dropped connection or a server error).",
        "Reconcile asks the product for its receipt of the original request, where it has "
        "one. Otherwise check in the product, then retry the same request (the product "
        "recognises its key) or cancel.",
        ("reconcile", "retry-same", "cancel"),
    ),
    HoldCode.RESPONSE_INVALID: Hold(
        "The product answered with something Coordinator cannot use",
        "The product said yes (2xx), so it probably acted, but its answer does not fit the "
        "operation's schema. The answer is kept below.",
        "Ask the product's owners about the answer. Reconcile uses the product's receipt, "
        "if it has a usable one; retrying sends the same request with the same key.",
        ("reconcile", "retry-same", "cancel"),
    ),
    HoldCode.RECEIPT_EXPIRED: Hold(
        "The product acted, but its answer has expired",
        "Sent again under its original key, the request was answered that the key was "
        "used by an original that took effect, and that the product no longer keeps its "
        "answer.",
        "Check the effect in the product. Nothing can be sent again under that key: cancel "
        "the run, and go on by hand if need be.",
        ("cancel",),
    ),
    HoldCode.PREPARED_COMMAND_MISMATCH: Hold(
        "The action changed at the registry since it was prepared",
        "The command was prepared and frozen under one version of the registry's action; "
        "it was to be sent again, but the registry now offers the action under another "
        "version, or not at all. Whether the first sending took effect is unknown.",
        "Check the record in the registry. Cancel; or retry once the registry offers the "
        "action as it was prepared.",
        ("retry-same", "cancel"),
    ),
    HoldCode.RESULT_CONCEALED: Hold(
        "The product shows no result for this key",
        "Coordinator's identity cannot see the result it waits for: the key is wrong, or "
        "the connection's identity or profile does not reach it.",
        "Fix the connection's identity or profile, then retry to read it again; or cancel.",
        ("retry-same", "cancel"),
    ),
    HoldCode.DISPATCH_INTERRUPTED: Hold(
        "Coordinator stopped while the request was out",
        "The request was sent, then Coordinator restarted or lost the run before it "
        "recorded the answer. An answer that came back later is kept below.",
        "Reconcile completes the step on the product's own evidence: its receipt, or the "
        "answer that came back late. If there is none, check in the product, then retry "
        "the same request or cancel.",
        ("reconcile", "retry-same", "cancel"),
    ),
    HoldCode.DEFINITION_UNUSABLE: Hold(
        "This build of Coordinator cannot load the run's workflow",
        "The workflow version the run started on cannot be read by the running build.",
        "Run a build that can read it, then retry; or cancel.",
        ("retry-same", "cancel"),
    ),
    HoldCode.ENGINE_DEFECT: Hold(
        "Coordinator failed at this step (a defect)",
        "Coordinator hit an error of its own here, the same one several times. The detail "
        "names it.",
        "Report it. Once fixed, retrying takes the step again (a call resends its sealed "
        "request with its key); or cancel.",
        ("retry-same", "cancel"),
    ),
    HoldCode.DATA_UNOPENABLE: Hold(
        "The run's stored data does not open",
        "Its personal data is stored encrypted, and what is stored does not open with "
        "Coordinator's keys: it was changed or copied from another run in the database, or "
        "it is under a key this configuration does not have. Nothing was sent after it was "
        "read; a request in flight before is shown as lost in the history.",
        "Have the database's administrator restore the value, or configure the keys it was "
        "sealed under, then retry; or cancel.",
        ("retry-same", "cancel"),
    ),
    HoldCode.RESTORED_REVIEW: Hold(
        "The database was restored from a backup",
        "The backup may not know what this run did after it was taken: a request it sent, "
        "an answer it had. Coordinator will not guess.",
        "Check the product for this run's effects since the backup. Retry with an "
        "attestation of what you found (the step is taken again, a call resends its sealed "
        "request with its key); reconcile on the product's receipt; or cancel.",
        ("retry-same", "reconcile", "cancel"),
    ),
}


def hold(code: str | None) -> Hold:
    """The words for a hold code; a code this build does not know is shown as it is."""
    try:
        return HOLDS[HoldCode(code or "")]
    except ValueError:
        return Hold(f"Held: {code}", "Coordinator holds this run for an operator.", "")


@dataclass(frozen=True)
class ActionWords:
    label: str
    does: str  # what it sends or changes
    never: str  # what it will not do


ACTIONS = {
    "retry-same": ActionWords(
        "Retry the same request",
        "Takes the step again: the sealed request is sent again byte for byte, with its "
        "original idempotency key, so a product that already applied it answers with the "
        "original result.",
        "It does not change the request, and does not assume the first sending failed.",
    ),
    "reconcile": ActionWords(
        "Reconcile with the product",
        "Asks the product for its receipt of the original key (or uses an answer that came "
        "back late) and completes the step only if that evidence confirms it.",
        "It sends no new command. Without confirming evidence the run stays held.",
    ),
    "cancel": ActionWords(
        "Cancel the run",
        "Stops the run: nothing more is sent. With a request in flight it ends once that "
        "request settles.",
        "It does not undo anything a product already did.",
    ),
}


#: Each kind of event a run's history holds, in plain words. A call's request is sealed
#: (call-dispatched) before it is sent, so what became of it is said by the event after.
EVENTS = {
    "admitted": "The run was started.",
    "call-dispatched": "A request to the product was sealed to be sent; the next event says "
    "what became of it.",
    "call-answered": "The product answered the request.",
    "call-not-sent": "The request never left Coordinator: the product did not receive it.",
    "call-lost": "The request may have reached the product, but no answer was recorded: "
    "whether the product acted is unknown.",
    "late-answer": "The product's answer came back after Coordinator had given up waiting; "
    "it is kept as evidence.",
    "retry-scheduled": "The step will be taken again later.",
    "verify-scheduled": "Whether the product acted is unknown: Coordinator will ask it, by "
    "its receipt of the request or by the same request under the same key, which it answers "
    "with the original.",
    "receipt-looked-up": "Coordinator asked the product for its receipt of the original "
    "request (a read: it changes nothing).",
    "step-completed": "The step completed.",
    "waiting": "The run waits: for a result from a product, or until a time.",
    "result-delivered": "The product said that the result is ready.",
    "result-polled": "Coordinator asked the product for the result, and it was not ready yet "
    "(noted again only when the answer changes).",
    "result-read": "Coordinator read the result from the product.",
    "held": "The run stopped for an operator to decide.",
    "retry-same": "An operator had the step taken again, with the same request.",
    "reconciled": "An operator completed the step on the product's own evidence.",
    "reconcile-unconfirmed": "An operator asked the product for evidence; it did not confirm "
    "the step, so the run stays held.",
    "cancel-requested": "An operator asked to cancel; the run ends once its request in "
    "flight settles.",
    "cancelled": "The run was cancelled.",
    "finished": "The run finished.",
    "failed": "The run failed.",
    "expired": "The run's deadline passed before it finished.",
}


def event(kind: str) -> str:
    """The words for an event kind; none for a kind this build does not know."""
    return EVENTS.get(kind, "")
