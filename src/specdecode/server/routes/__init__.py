"""The server's routes, one module per family of endpoints; `app.create_app` registers them. Each
reads what it needs of the server from `request.app.state.server` (`state.ServerState`).

    generation  POST /v1/chat/completions, /v1/completions
    models      GET  /v1/models, /v1/models/{model_id}
    tokens      POST /tokenize, /detokenize; GET /tokenizer_info
    ops         GET  /health, /metrics
    page        GET  / and /page/{name}: the server's own page (`static/`)
"""
