"""Node choice as small pure pieces (after llm-d's endpoint picker): filters -> scorers -> picker.

`view.NodeView` is what a replica knows about one node (from heartbeats and the
cross-replica in-flight counter); `filters` drop nodes that must get nothing; `scorers`
order the rest (on-premises first, then least loaded); `picker.rank` combines them.
"""
