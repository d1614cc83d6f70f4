"""The import cycles of a graph of modules, for the layering checks
(check-kmod-imports.sh, check-rust-imports.py)."""


def cycles(graph):
    """Each cycle a depth-first search over `graph` ({node: [nodes it
    imports]}, nodes sortable) closes with a back edge, as the list of its
    nodes, the first repeated at the end. Every graph with a cycle yields at
    least one; one back edge is reported once."""
    found, state, stack = [], {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for imported in graph.get(node, []):
            if state.get(imported) == "open":
                found.append(stack[stack.index(imported):] + [imported])
            elif imported not in state:
                visit(imported)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return found
