"""Wire formats: OpenAI SSE framing (`openai`), gateway -> orchestrator (`dispatch`),
orchestrator <-> agent (`node`)."""
