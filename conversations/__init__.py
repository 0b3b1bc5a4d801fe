"""Conversations: threads of question-and-answer turns, each owned by one user
(``conversations.store``: the ``ConversationStore`` port and its PostgreSQL adapter;
``conversations.memory``: an in-process one for tests and fakes)."""
