"""The request/result contract: plain structs and their readers, importable without torch, on the ground floor
(every folder may import it; it imports nothing of the package). Normalisers belong to the module that owns the
message.

    messages.py      the request and result messages, validated once (field names and limits); a request with
                     its caller's scope (ScopedRequest, what the queues hand the engine)
    info.py          what a running engine serves (GetModelInfo, /v1/model)
    defaults.py      a request's defaults and limits, the engine's own settings' defaults
    document_ids.py  the shape of a document id
    chat.py          a chat compressed message by message: the query, what stays whole, each message's share
                     of the budget (the gateway routes' and the LiteLLM hook's rules)
    conversation.py  the conversation readers: a chat's messages as documents and questions
    settings.py      how a setting is declared (flag, environment name, default, bounds, help), read and checked
"""
