"""The reference DDP job: what the DDP tutorials teach, as a canary that proves a machine can train.

Run by `ddpdoctor run` under torchrun (`python -m ddpdoctor.reference`), and runnable under plain
torchrun too, where the ddpdoctor runtime stays inactive. One module per concern:

    config   the job's command line
    data     CIFAR-10 (real, from a folder) or a deterministic synthetic CIFAR-shaped set
    model    a small CNN (CPU default) or torchvision's resnet18
    inject   the `--inject KIND:rank=R,...` specification (parsed by `ddpdoctor run` too)
    faults   `--inject` faults, each recorded as an event before it fires
    verify   checkpoint round trip, evaluation, the cross-rank parameter check
    train    init, data, model, the loop and its step timings, checkpoint, evaluation, verification

May import: the runtime (ddpdoctor.runtime), the protocol and the shared vocabulary below it.
"""
