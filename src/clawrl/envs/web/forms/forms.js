// What the forms' pages share. A page passes what has been entered so far on to the next one in
// its URL's query (every form is a GET form); the last page of a form publishes it as
// window.clawrlResult, which tells the environment that the task is over and what was submitted.

var clawrl = {
  params: function () {
    var found = {};
    new URLSearchParams(window.location.search).forEach(function (value, key) { found[key] = value; });
    return found;
  },

  // Hidden inputs carrying the fields of the earlier pages through `form`
  carry: function (form, names) {
    var params = clawrl.params();
    names.forEach(function (name) {
      if (params[name] === undefined) return;
      var input = document.createElement("input");
      input.type = "hidden";
      input.name = name;
      input.value = params[name];
      form.appendChild(input);
    });
  },

  // Give the named fields of `form` the values the query holds (text, lists, checkboxes)
  prefill: function (form) {
    var params = clawrl.params();
    Array.prototype.forEach.call(form.elements, function (field) {
      if (!field.name) return;
      if (field.type === "checkbox") field.checked = params[field.name] === "on";
      else if (params[field.name] !== undefined) field.value = params[field.name];
    });
  },

  options: function (select, values) {
    values.forEach(function (value) {
      var option = document.createElement("option");
      option.text = value;
      select.add(option);
    });
  },

  finish: function () {
    window.clawrlResult = clawrl.params();
  },
};
