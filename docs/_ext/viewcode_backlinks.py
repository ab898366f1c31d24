"""Sphinx extension: the "[docs]" links of the source viewer (sphinx.ext.viewcode) land on their anchors.

viewcode writes each back-link as ``<page where the object was documented last>#<module that documented it
first>.<name>``. An object documented twice — on its own module's page and again on the page of a module that
re-exports it (autodoc follows ``__all__``, so ``transformer_np.grader.specs`` documents ``Case`` of
``grader.exercise_base``) — gets the page of one and the anchor of the other: 137 of 569 back-links of the site
pointed to an anchor that does not exist.

Before viewcode writes its pages, this picks for every source module the prefix under which most of its objects
were documented (the module itself whenever its own page documents them) and points each back-link to the page
the Python domain records for ``prefix.name``, where Sphinx wrote that anchor. tests/test_docs_built.py counts
the dead anchors of the built site.
"""

from __future__ import annotations


def _fix_backlinks(app):
    env = app.env
    modules = getattr(env, "_viewcode_modules", None)
    if not modules:
        return []
    objects = env.get_domain("py").objects           # full name -> ObjectEntry(docname, node_id, ...)
    for modname, entry in list(modules.items()):
        if not entry:
            continue
        code, tags, used, refname = entry
        candidates = [modname] + ([refname] if refname != modname else [])
        best = max(candidates, key=lambda prefix: sum(f"{prefix}.{name}" in objects for name in used))
        for name in used:
            found = objects.get(f"{best}.{name}")
            if found is not None:
                used[name] = found.docname
        modules[modname] = (code, tags, used, best)
    return []                                        # html-collect-pages: no page of its own


def setup(app):
    # priority 400: before viewcode's own html-collect-pages handler (500), which writes the back-links
    app.connect("html-collect-pages", _fix_backlinks, priority=400)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
