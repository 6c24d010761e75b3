"""The runs of one `Runtime` as it holds them: a run's handle and result (`handle`), the runs its
loops drive now (`active`), and decisions checked against a run before they are recorded
(`intake`). Between the facade, which uses them, and the loop, which they hold."""
