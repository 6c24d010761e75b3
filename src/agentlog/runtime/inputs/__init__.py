"""What a client sends into a run besides its messages, and the checks it passes before the first
write: the run input and what an agent lets it change (`run_input`), the tools the client runs
itself (`frontend`), and the start admission both serve and gateway mode call (`admission`).

The loop reads the recorded run input and frontend tools from its folded context, so this room
sits below the loop and imports none of it. Messages queued into a running run
(`agentlog.runtime.queued`) are an input too, but they are recorded with the loop's `Entropy`, so
they stay beside the facade that records them: here they would make the loop and this room import
each other.
"""
